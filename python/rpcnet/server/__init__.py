"""The asyncio server: one task per connection, each with its own isolated session."""
