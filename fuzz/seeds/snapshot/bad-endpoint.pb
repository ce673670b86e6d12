n3´…apiVersion: router/v1
kind: RoutingPolicy
spec: {pools: [{name: a, endpoints: ["127.0.0.1:9001"]}], routes: [{name: r, chain: [a]}]}

aftp://x"
anot an endpoint*cp