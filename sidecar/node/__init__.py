"""One node: start/stop order (`node`), the plugin link and event stream (`sync`), files and
Mosquitto's config (`layout`), and the read-only view admin and metrics take (`facts`)."""
