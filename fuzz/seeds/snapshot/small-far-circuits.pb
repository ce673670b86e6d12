ÿÿÿÿÿÿÿÿÿn18446744073709551615“	…apiVersion: router/v1
kind: RoutingPolicy
spec: {pools: [{name: a, endpoints: ["127.0.0.1:9001"]}], routes: [{name: r, chain: [a]}]}
#
a127.0.0.1:9001127.0.0.1:9002"#
a127.0.0.1:9001 ÿÿÿÿÿÿÿÿ*cp""
a127.0.0.1:9001 €€€€€€€€€*cp"
nope127.0.0.1:1*cp