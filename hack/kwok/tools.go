//go:build tools

// Package kwokbin pins kwok, the simulated nodes and pod lifecycles of `bookfleet bench operator --scale`.
package kwokbin

import _ "sigs.k8s.io/kwok/cmd/kwok"
