"""The live status page (issue 22): the cluster as `mqfed ctl status` sees it, drawn by each
node's metrics listener at `/`, with JSON at `/status.json` and `/routes.json`."""
