"""The commented `.env` template `narwhal init` writes."""

TEMPLATE = """\
# Narwhal workstation inputs. Private: keep mode 0600; never commit it.
# KEY=value lines only; no shell expansion. Quote values with spaces.
# NARWHAL_<FIELD> sets a fleet-wide value; NARWHAL_NODE_<n>_<FIELD> overrides it for engine n.

# Deployment name (the record lives in runs/<name>/) and the approved source revision.
NARWHAL_DEPLOYMENT=fleet
NARWHAL_DEPLOYMENT_REVISION=

# SSH destinations: user@host or ssh://user@host:port. One engine per NARWHAL_NODE_<n>_SSH.
# Roles with the same destination share one physical host.
NARWHAL_ROUTER_SSH=
NARWHAL_NODE_1_SSH=
NARWHAL_NODE_2_SSH=
# Private key for key auth (absolute path on this workstation).
NARWHAL_SSH_KEY=
# Password auth instead (needs sshpass): <ssh variable>_PASSWORD, e.g.
# NARWHAL_NODE_2_SSH_PASSWORD=
# Pinned host keys (default runs/<deployment>/known_hosts); fill with `narwhal hosts trust`.
# NARWHAL_SSH_KNOWN_HOSTS=
# NARWHAL_SSH_CONNECT_TIMEOUT=10

# Engine image pinned by ID (sha256:<64 hex>) or digest (<name>@sha256:<64 hex>).
NARWHAL_ENGINE_IMAGE=
NARWHAL_ENGINE_MODEL_NAME=
# Paths on the engine hosts.
NARWHAL_MODEL_DIR=
# Stage the checkpoint there from a Hugging Face hub (Gate A; optional): the repo, a branch,
# tag or commit (pinned to a commit once and recorded), and a mirror's address if not the hub.
# A gated or private repo needs NARWHAL_HF_TOKEN.
# MODEL_REPO_ID=Qwen/Qwen2.5-0.5B-Instruct
# MODEL_REVISION=main
# HF_ENDPOINT=https://huggingface.co
NARWHAL_RUN_DIR=
NARWHAL_FABRIC_INTERFACE=
# Optional per engine: NARWHAL_NODE_<n>_IP (fabric address), NARWHAL_NODE_<n>_GPU_IDS=0,1

# Ports on each engine host.
NARWHAL_ENGINE_PORT=8000
NARWHAL_ATTEST_PORT=8010
NARWHAL_NIXL_SIDE_CHANNEL_PORT=5600
NARWHAL_UCX_TCP_PORT_RANGE=30000-30100
# KV cache events (optional): each engine publishes vLLM's KV events on this port (every
# interface; open it to the router host only) and the router places requests on the engines'
# cache state. Unset: no events; the router follows its own routing history instead.
# NARWHAL_KV_EVENTS_PORT=5557

# Launch policy (optional): TENSOR_PARALLEL_SIZE, MODEL_DTYPE (bfloat16|float16), BLOCK_SIZE,
# ENGINE_ARGS (JSON array), ENGINE_ENV (JSON object), TRANSFER_TRANSPORT (ucx_tcp|ucx_rdma),
# KV_BUFFER_DEVICE (cuda|cpu: where NIXL stages KV; cpu for CPU engines).
# JSON elements hold no shell characters (; | & $ ` < >); credentials go in the secrets below.

# Observability (optional): Grafana's bind IP, Prometheus' HOST:PORT, shared GPUs (true|false).
# NARWHAL_GRAFANA_BIND_ADDRESS=127.0.0.1
# NARWHAL_PROMETHEUS_LISTEN_ADDRESS=127.0.0.1:9090
# NARWHAL_SHARED_GPU_ALLOWANCE=false

# Live KV canary (optional): while the router serves, each ordered producer -> consumer pair
# is probed once per this many seconds (0.1 to 86400) and a pair that answers wrong, recomputes
# or fails is held out of placement. Gate F writes it into the fleet; a change repeats F and G.
# NARWHAL_KV_CANARY_INTERVAL_S=60

# Service level objectives (seconds).
NARWHAL_TTFT_S=10
NARWHAL_TPOT_S=0.125

# Workload the fleet is sized for (optional; the defaults are shown). Gate D budgets every
# directed fabric edge from it: a changed value makes that budget stale.
# Typical prompt length in tokens (1 to 10000000).
# NARWHAL_WORKLOAD_PROMPT_TOKENS=1024
# Mean KV handoffs (prefill to decode) per second, above 0.
# NARWHAL_WORKLOAD_HANDOFFS_PER_S=1
# Handoffs that can arrive at once, each finishing within the transfer budget (whole, >= 1).
# NARWHAL_WORKLOAD_BURST=1
# Milliseconds one handoff's KV transfer may take, above 0.
# NARWHAL_WORKLOAD_TRANSFER_BUDGET_MS=1000
# Margin on the required bandwidth, at least 1.
# NARWHAL_WORKLOAD_HEADROOM=1.25

# Secrets (optional): API key the engines require.
# NARWHAL_ENGINE_KEY=
"""
