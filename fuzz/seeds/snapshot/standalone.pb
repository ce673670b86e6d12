n7Û	Ü# A minimal standalone policy: two pools, one route.
#   cargo run -p router-proxy -- --policy deploy/examples/standalone.yaml
# The file is watched: edit it and the proxy reloads (a bad edit is
# rejected, logged, and the last good policy keeps serving).
apiVersion: router/v1
kind: RoutingPolicy
metadata:
  name: standalone-demo
spec:
  # Defaults for every pool; anything left out comes from CUSTOM_ROUTER_*.
  queue:
    max_size: 1000
    timeout_s: 30
    latency_threshold_s: 3.0
    ewma_alpha: 0.3
    scoring: peak_ewma        # or lowest_ewma (the Hugging Face rule)
  pools:
    - name: local
      provider: vllm
      model: qwen3:8b
      endpoints: ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
      max_concurrency: 4      # per endpoint
    - name: cloud
      provider: openai
      model: gpt-4o-mini
      endpoints: ["https://api.openai.com/v1"]
      queue: {max_size: 100}
  routes:
    - name: default
      match: {}
      # Fallback on failure comes with the deadline work; today the first
      # pool of the chain that has endpoints takes the request.
      chain: [local, cloud]
E
localhttp://127.0.0.1:8001127.0.0.1:8003http://127.0.0.1:8001"$
local127.0.0.1:8003 €ðÌ†¦7*cp"
cloud*cp