#!/usr/bin/env sh
# Draws the pictures of docs/explanation/epsilon-delta.md (run from the repository root).
set -eu
dpcurator="${DPCURATOR:-.venv/bin/dpcurator}"
"$dpcurator" explain --mechanism gaussian --noise 1 --epsilon 1 \
    --plot docs/what-delta-means-gaussian.png --json
"$dpcurator" explain --mechanism name-and-shame --probability 0.05 --epsilon 1 \
    --plot docs/what-delta-means-name-and-shame.png --json
