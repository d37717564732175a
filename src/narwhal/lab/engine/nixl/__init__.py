"""The emulator's NIXL side (pull mode), behind the seam in `api.py`.

    connector.py  make_connector(): wires the pieces below for one engine core
    settings.py   what is read from the engine's config and faults; kv_transfer_config checks
    wire.py       side-channel payloads: NixlAgentMetadata, reply frames, our agent blob
    listener.py   the ZMQ ROUTER side channel, with vLLM's quirks (dies on a bad rank/frame)
    handshake.py  the consumer's handshake: hash, engine id, core/kv pair checks; cached
    params.py     kv_transfer_params written by the producer, validated by the consumer
    leases.py     producer-side block leases and their expiry
    frames.py     bounded control frames of the block transfer
    transfer.py   the producer's block server and the consumer's read-then-notify
    failures.py   vLLM's failure texts
"""
