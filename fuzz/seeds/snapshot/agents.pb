n1Ä # The four-rule agent router of the deterministic-policy seed, as a policy.
#
#   1. SEND / DESTRUCTIVE      -> cloud-strong, with an approval gate
#   2. local unhealthy or queue > 4, or latency > 0.7 x budget -> cloud
#   3. free VRAM > 22,000 MB   -> local-medium; > 6,000 MB -> local-small
#   4. otherwise               -> cloud (cheap; strong for structured output)
#
# Check it offline:   routerctl policy validate -f deploy/examples/agents.yaml
# Ask it:             routerctl route explain -f deploy/examples/agents.yaml < situation.json
apiVersion: router/v1
kind: RoutingPolicy
metadata:
  name: agents
spec:
  defaults:
    deadline_ms: 2000           # the latency budget
    risk: READ
  approval:
    token_env: ROUTER_APPROVAL_TOKEN
  circuit_breaker:
    consecutive_errors: 3
    open_duration_s: 60
  structured_output_degrade_s: 60
  pools:
    - name: local-medium
      provider: ollama
      model: qwen3.6:27b-q4_K_M
      endpoints: ["http://127.0.0.1:11434"]
      max_concurrency: 4
      gates: {healthy: true, max_queue_depth: 4, max_latency_budget_fraction: 0.7, min_vram_free_mb: 22000}
      capacity_probe: {kind: ollama, interval_ms: 1000, vram_total_mb: 65536}
    - name: local-small
      provider: ollama
      model: qwen3:8b-q4_K_M
      endpoints: ["http://127.0.0.1:11434"]
      max_concurrency: 4
      gates: {healthy: true, max_queue_depth: 4, max_latency_budget_fraction: 0.7, min_vram_free_mb: 6000}
      capacity_probe: {kind: ollama, interval_ms: 1000, vram_total_mb: 65536}
    - name: cloud-cheap
      provider: openai
      model: deepseek/deepseek-chat-v3-0324
      endpoints: ["https://openrouter.ai/api/v1"]
      api_key_env: OPENROUTER_API_KEY
      structured_output: false
      price: {input_per_1k_usd: 0.0003, output_per_1k_usd: 0.0007}
    - name: cloud-strong
      provider: openai
      model: anthropic/claude-sonnet-4-20250514
      endpoints: ["https://openrouter.ai/api/v1"]
      api_key_env: OPENROUTER_API_KEY
      structured_output: true
      price: {input_per_1k_usd: 0.003, output_per_1k_usd: 0.015}
  routes:
    - name: governed
      match: {risk: [SEND, DESTRUCTIVE]}
      chain: [cloud-strong]
      requires_approval: true
      allow_downgrade: false
    - name: default
      match: {}
      chain: [local-medium, local-small, cloud-cheap, cloud-strong]
      cost_ceiling_per_call_usd: 0.08
      retry_on: [connect_error, timeout, status_429, status_5xx, malformed_json]
"
cloud-cheap ÿÿÿÿÿÿÿÿ*cp