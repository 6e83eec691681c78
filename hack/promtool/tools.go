//go:build tools

// Package promtoolbin pins the promtool command the chart's alert rule tests build.
package promtoolbin

import _ "github.com/prometheus/prometheus/cmd/promtool"
