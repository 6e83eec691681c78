"""The operator benchmark (`bookfleet bench operator`): development tooling, never in the wheel, because what it runs
on is test tooling (the Kubernetes API emulator, the local Kubernetes cluster, kwok nodes). The product's command
(bookfleet/bench/kube_operator.py) declares and checks the options, then runs `python -m tests.operatorbench` from
the source checkout with them."""
