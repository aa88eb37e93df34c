// The API, asked with the token the user signed in with (kept in this tab's sessionStorage).
const KEY = "dpcurator.token";

export class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

export function token() { return sessionStorage.getItem(KEY); }
export function signIn(value) { sessionStorage.setItem(KEY, value); }
export function signOut() { sessionStorage.clear(); }

// GET or POST a /v1 path; the JSON answer, or an ApiError with the service's own message.
export async function api(path, body) {
  const headers = { Authorization: `Bearer ${token() || ""}` };
  const init = { headers, cache: "no-store" };
  if (body !== undefined) {
    init.method = "POST";
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  let data = null;
  try { data = await response.json(); } catch { data = null; }
  if (!response.ok) {
    const error = (data && data.error) || {};
    throw new ApiError(response.status, error.type || "error",
                       error.message || `the service answered ${response.status}`);
  }
  return data;
}

export const enc = encodeURIComponent;
