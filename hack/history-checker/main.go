// history-checker decides whether a recorded client history of bookfleet ledgers is legal for a single-writer
// append-only log (see model.go), with porcupine. It reads JSON lines (one event each, from any number of files,
// merged by time), prints one JSON verdict line, writes porcupine's visualization of each illegal partition (up to
// -max-html) into -html-dir, and exits 0 (legal), 1 (illegal), 2 (undecided: the time limit ran out) or 3 (bad input).
//
// An event: {"type": "invoke"|"ok"|"fail", "id": "<unique per operation>", "process": "w1", "t": <ns, one clock>,
// "f": "add"|"read"|"close"|"reopen", "ledger": 7, "entry": 3, "digest": "ab12..", "last": 9, "missing": false}.
// invoke carries f, ledger, entry (add, read) and digest (add); ok carries what the client was told (add: entry and
// digest; read: digest or missing; close, reopen: last). An add with no ok may or may not have happened; any other
// operation with no ok is left out (it told nobody anything).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

type event struct {
	Type    string `json:"type"`
	ID      string `json:"id"`
	Process string `json:"process"`
	T       int64  `json:"t"`
	F       string `json:"f"`
	Ledger  int64  `json:"ledger"`
	Entry   *int64 `json:"entry"`
	Digest  string `json:"digest"`
	Last    *int64 `json:"last"`
	Missing bool   `json:"missing"`
}

type verdict struct {
	Verdict       string   `json:"verdict"`
	Events        int      `json:"events"`
	Operations    int      `json:"operations"`
	Partitions    int      `json:"partitions"`
	Ledgers       int      `json:"ledgers"`
	Acknowledged  int      `json:"acknowledged"`
	Violations    []string `json:"violations"`
	Visualization []string `json:"visualization"`
	Seconds       float64  `json:"seconds"`
}

func readEvents(paths []string) ([]event, error) {
	var events []event
	read := func(r io.Reader, name string) error {
		scanner := bufio.NewScanner(r)
		scanner.Buffer(make([]byte, 1<<20), 1<<20)
		for line := 1; scanner.Scan(); line++ {
			if len(scanner.Bytes()) == 0 {
				continue
			}
			var ev event
			if err := json.Unmarshal(scanner.Bytes(), &ev); err != nil {
				return fmt.Errorf("%s:%d: %v", name, line, err)
			}
			events = append(events, ev)
		}
		return scanner.Err()
	}
	if len(paths) == 0 {
		return events, read(os.Stdin, "stdin")
	}
	for _, path := range paths {
		file, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		err = read(file, path)
		file.Close()
		if err != nil {
			return nil, err
		}
	}
	return events, nil
}

// operations pairs invocations with their completions; unacknowledged adds stay open until after the last event.
func operations(events []event) ([]porcupine.Operation, map[string]int, error) {
	sort.SliceStable(events, func(i, j int) bool { return events[i].T < events[j].T })
	clients := map[string]int{}
	invoked := map[string]event{}
	completed := map[string]event{}
	var order []string
	end := int64(math.MinInt64)
	for _, ev := range events {
		end = max(end, ev.T)
		switch ev.Type {
		case "invoke":
			if _, seen := invoked[ev.ID]; seen {
				return nil, nil, fmt.Errorf("operation %q invoked twice", ev.ID)
			}
			if ev.F != OpAdd && ev.F != OpRead && ev.F != OpClose && ev.F != OpReopen {
				return nil, nil, fmt.Errorf("operation %q: unknown kind %q", ev.ID, ev.F)
			}
			if (ev.F == OpAdd || ev.F == OpRead) && ev.Entry == nil {
				return nil, nil, fmt.Errorf("operation %q: %s without an entry id", ev.ID, ev.F)
			}
			if _, known := clients[ev.Process]; !known {
				clients[ev.Process] = len(clients)
			}
			invoked[ev.ID] = ev
			order = append(order, ev.ID)
		case "ok":
			completed[ev.ID] = ev
		case "fail":
		default:
			return nil, nil, fmt.Errorf("operation %q: unknown event type %q", ev.ID, ev.Type)
		}
	}
	var ops []porcupine.Operation
	for _, id := range order {
		call := invoked[id]
		done, ok := completed[id]
		in := Input{Op: call.F, Ledger: call.Ledger, Digest: call.Digest}
		if call.Entry != nil {
			in.Entry = *call.Entry
		}
		out := Output{Known: ok}
		ret := end + 1
		if ok {
			ret = done.T
			if done.T < call.T {
				return nil, nil, fmt.Errorf("operation %q completed before it was invoked", id)
			}
			switch call.F {
			case OpAdd:
				if done.Entry != nil {
					in.Entry = *done.Entry // the id the writer was given (the harness predicts it at invocation)
				}
				if done.Digest != "" && done.Digest != call.Digest {
					return nil, nil, fmt.Errorf("add %q acknowledged another payload than it sent", id)
				}
			case OpRead:
				out.Digest, out.Missing = done.Digest, done.Missing
			case OpClose, OpReopen:
				if done.Last == nil {
					return nil, nil, fmt.Errorf("operation %q: %s completed without a last entry id", id, call.F)
				}
				out.Last = *done.Last
			}
		} else if call.F != OpAdd {
			continue // a read, close or reopen that told nobody anything
		}
		ops = append(ops, porcupine.Operation{
			ClientId: clients[call.Process], Input: in, Output: out, Call: call.T, Return: ret,
		})
	}
	return ops, clients, nil
}

func main() {
	htmlDir := flag.String("html-dir", "", "write porcupine's visualization of illegal partitions here")
	maxHTML := flag.Int("max-html", 5, "at most this many visualizations")
	timeout := flag.Duration("timeout", 10*time.Minute, "give up (verdict unknown) after this long")
	flag.Parse()
	started := time.Now()
	events, err := readEvents(flag.Args())
	var ops []porcupine.Operation
	if err == nil {
		ops, _, err = operations(events)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "history-checker:", err)
		os.Exit(3)
	}
	model := Model.ToModel()
	partitions := partitionByEntry(ops)
	result := verdict{Events: len(events), Operations: len(ops), Partitions: len(partitions)}
	ledgers := map[int64]bool{}
	for _, op := range ops {
		ledgers[op.Input.(Input).Ledger] = true
		if op.Input.(Input).Op == OpAdd && op.Output.(Output).Known {
			result.Acknowledged++
		}
	}
	result.Ledgers = len(ledgers)
	outcome := porcupine.CheckOperationsTimeout(model, ops, *timeout)
	result.Verdict = map[porcupine.CheckResult]string{
		porcupine.Ok: "legal", porcupine.Illegal: "illegal", porcupine.Unknown: "unknown",
	}[outcome]
	if outcome == porcupine.Illegal { // name each illegal partition, and draw the first few
		single := model
		single.Partition = nil
		for _, partition := range partitions {
			check, info := porcupine.CheckOperationsVerbose(single, partition, *timeout)
			if check != porcupine.Illegal {
				continue
			}
			first := partition[0].Input.(Input)
			result.Violations = append(result.Violations, fmt.Sprintf("ledger %d entry %d", first.Ledger, first.Entry))
			if *htmlDir != "" && len(result.Visualization) < *maxHTML {
				path := filepath.Join(*htmlDir, fmt.Sprintf("ledger-%d-entry-%d.html", first.Ledger, first.Entry))
				if err := os.MkdirAll(*htmlDir, 0o755); err == nil && porcupine.VisualizePath(single, info, path) == nil {
					result.Visualization = append(result.Visualization, path)
				}
			}
		}
		sort.Strings(result.Violations)
	}
	result.Seconds = math.Round(time.Since(started).Seconds()*10) / 10
	line, _ := json.Marshal(result)
	fmt.Println(string(line))
	os.Exit(map[porcupine.CheckResult]int{porcupine.Ok: 0, porcupine.Illegal: 1, porcupine.Unknown: 2}[outcome])
}
