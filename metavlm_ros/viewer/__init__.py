"""Results in Foxglove and Lichtblick: channels, MCAP export, bag merge, live WebSocket server."""

__all__ = ['DEFAULT_HOST', 'bag_merge', 'channels', 'export', 'live']

#: Where a live server binds unless the user names another address: loopback, so that evidence is
#: not served to the network by default (`metavlm search --foxglove-host`, the tester's foxglove_host).
DEFAULT_HOST = '127.0.0.1'
