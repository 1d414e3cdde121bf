"""The asyncio remoting transport: connections, server, client and the blocking wrapper over the sans-IO codec in sluice.protocol."""
