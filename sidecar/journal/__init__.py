"""The node-local journal of acknowledged messages peers want (architecture §3, "The journal").

The plugin writes it (deploy/mosquitto-plugin/src/journal.c). Cores: `record` (the file format,
fingerprints, what a dead run left unconfirmed), `confirmations` (which copies the forwarding
client settled). Adapter: `service` (confirmations to the plugin, replay of dead runs' files).
"""
