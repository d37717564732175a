"""The client side: HTTP/1.1 server, connection and descriptor budgets, routes, response bytes."""
