"""The trusted curator as a service: analysts send questions, never touch the data.

- ``create_app(load_config("curator.toml"))``: the ASGI app (FastAPI); ``dpcurator serve
  --config curator.toml`` runs it on uvicorn.
- ``Service``: the same logic without HTTP (reserve first, answer, store, send).
- ``connect(url, token)`` (also ``dp.connect``): a remote curator with the library's names;
  standard library only, so it needs none of the ``server`` extra.

The service needs the ``server`` extra (``pip install 'dpcurator[server]'``).
"""

from typing import TYPE_CHECKING

from dpcurator._lazy import exports

if TYPE_CHECKING:
    from dpcurator.server._app import create_app
    from dpcurator.server._config import ConfigError, ServiceConfig, load_config
    from dpcurator.server._service import Service, ServiceError
    from dpcurator.server.client import RemoteCurator, connect

__all__ = ["ConfigError", "RemoteCurator", "Service", "ServiceConfig", "ServiceError",
           "connect", "create_app", "load_config"]

__getattr__, __dir__ = exports(__name__, {
    "create_app": "dpcurator.server._app",
    "ConfigError": "dpcurator.server._config",
    "ServiceConfig": "dpcurator.server._config",
    "load_config": "dpcurator.server._config",
    "Service": "dpcurator.server._service",
    "ServiceError": "dpcurator.server._service",
    "RemoteCurator": "dpcurator.server.client",
    "connect": "dpcurator.server.client",
})
