"""The node's Mosquitto: config generation and process supervision."""
