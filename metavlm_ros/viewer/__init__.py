"""Results in Foxglove and Lichtblick: channels, MCAP export, bag merge, live WebSocket server."""

__all__ = ['bag_merge', 'channels', 'export', 'live']
