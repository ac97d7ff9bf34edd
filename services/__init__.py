"""mqstore services: gRPC servicers over libstore, the embedded suite and the ``mqstore`` CLI."""
