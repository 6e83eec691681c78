package main

// The model: what a legal history of one entry of a single-writer append-only ledger looks like.
//
// The checker never asks the code under test anything: it only knows what clients invoked and what they were told.
// A ledger's history is partitioned by entry id (each partition is one entry plus every ledger-wide operation of
// its ledger: close, recovery, reopen), so porcupine checks many small histories instead of one huge one.

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// Op kinds, as the harness writes them in the history's "f" field.
const (
	OpAdd    = "add"    // a writer appended a payload; "ok" = acknowledged with that entry id
	OpRead   = "read"   // a reader (at or below its LAC) or a final check read one entry
	OpClose  = "close"  // close by the writer or recovery: the ledger's last entry is fixed at "last"
	OpReopen = "reopen" // a new writer continues an open ledger after the entry "last" it found confirmed
)

// Input is what one partition's operation asked for.
type Input struct {
	Op     string
	Ledger int64
	Entry  int64  // the partition's entry id (for close/reopen: the entry this copy of the op is checked against)
	Digest string // add: the payload's digest
}

// Output is what the operation was told; Known is false for an add that was never acknowledged (it may or may not
// have been written: a crashed writer, a failed add, a SIGKILLed process).
type Output struct {
	Known   bool
	Digest  string // read: the payload's digest ("" with Missing)
	Missing bool   // read: the entry was not found anywhere
	Last    int64  // close / reopen: the last entry id the operation fixed
}

// State of one entry id of one ledger.
type State struct {
	Digest  string // the payload the entry holds, "" while none is written (or after it was cut off)
	Durable bool   // acknowledged or seen by a reader: it must stay readable with Digest forever
	Closed  bool
	Last    int64 // with Closed: the ledger's last entry id
}

func step(s State, in Input, out Output) []State {
	e := in.Entry
	switch in.Op {
	case OpAdd:
		if !out.Known { // may or may not have happened; if it did, only where nothing else is and the end allows
			if s.Digest == "" && !(s.Closed && e > s.Last) {
				written := s
				written.Digest = in.Digest
				return []State{s, written}
			}
			return []State{s}
		}
		if s.Digest != "" && s.Digest != in.Digest { // an acknowledged entry overwrote another payload
			return nil
		}
		if s.Closed && e > s.Last { // acknowledged past the end the ledger was closed at
			return nil
		}
		s.Digest, s.Durable = in.Digest, true
		return []State{s}
	case OpRead:
		if out.Missing { // legal only for an entry that never became durable and is not inside a closed ledger
			if s.Durable || (s.Closed && e <= s.Last) {
				return nil
			}
			return []State{s}
		}
		if s.Digest == "" || s.Digest != out.Digest || (s.Closed && e > s.Last) {
			return nil // a payload nobody wrote there, a second payload for one id, or past the closed end
		}
		s.Durable = true // a reader saw it: readers stay at or below the LAC, so it can never be cut off
		return []State{s}
	case OpClose, OpReopen:
		if s.Closed && (in.Op == OpReopen || out.Last != s.Last) {
			return nil // a closed ledger is never reopened, and its end never moves
		}
		if e > out.Last {
			if s.Durable {
				return nil // closed (or taken over) short: an acknowledged or read entry is cut off
			}
			s.Digest = "" // an unacknowledged entry past the end is gone; a later writer may use the id
		} else if s.Digest == "" {
			return nil // the end covers an entry nobody wrote (yet)
		} else {
			s.Durable = true
		}
		if in.Op == OpClose {
			s.Closed, s.Last = true, out.Last
		}
		return []State{s}
	}
	return nil
}

// Model is the porcupine model; Partition splits a history by (ledger, entry id).
var Model = porcupine.NondeterministicModel{
	Partition: partitionByEntry,
	Init:      func() []interface{} { return []interface{}{State{Last: -1}} },
	Step: func(state, input, output interface{}) []interface{} {
		next := step(state.(State), input.(Input), output.(Output))
		states := make([]interface{}, len(next))
		for i, s := range next {
			states[i] = s
		}
		return states
	},
	Equal: func(a, b interface{}) bool { return a.(State) == b.(State) },
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(Input), output.(Output)
		switch {
		case in.Op == OpAdd && !out.Known:
			return fmt.Sprintf("add(%d:%d, %.8s) -> ?", in.Ledger, in.Entry, in.Digest)
		case in.Op == OpAdd:
			return fmt.Sprintf("add(%d:%d, %.8s) -> ack", in.Ledger, in.Entry, in.Digest)
		case in.Op == OpRead && out.Missing:
			return fmt.Sprintf("read(%d:%d) -> missing", in.Ledger, in.Entry)
		case in.Op == OpRead:
			return fmt.Sprintf("read(%d:%d) -> %.8s", in.Ledger, in.Entry, out.Digest)
		}
		return fmt.Sprintf("%s(%d) -> last %d", in.Op, in.Ledger, out.Last)
	},
	DescribeState: func(state interface{}) string {
		s := state.(State)
		text := fmt.Sprintf("payload %.8s durable=%v", s.Digest, s.Durable)
		if s.Closed {
			text += fmt.Sprintf(" closed at %d", s.Last)
		}
		return text
	},
}

// partitionByEntry: one partition per (ledger, entry id) touched by an add or a read, or covered by a close or
// reopen; ledger-wide operations are copied into every partition of their ledger, with Input.Entry set to it.
func partitionByEntry(history []porcupine.Operation) [][]porcupine.Operation {
	type key struct{ ledger, entry int64 }
	entries := map[int64]map[int64]bool{}
	wide := map[int64][]porcupine.Operation{}
	note := func(ledger, entry int64) {
		if entries[ledger] == nil {
			entries[ledger] = map[int64]bool{}
		}
		entries[ledger][entry] = true
	}
	for _, op := range history {
		in := op.Input.(Input)
		if in.Op == OpClose || in.Op == OpReopen {
			wide[in.Ledger] = append(wide[in.Ledger], op)
			for e := int64(0); e <= op.Output.(Output).Last; e++ {
				note(in.Ledger, e)
			}
		} else {
			note(in.Ledger, in.Entry)
		}
	}
	byKey := map[key][]porcupine.Operation{}
	for _, op := range history {
		if in := op.Input.(Input); in.Op == OpAdd || in.Op == OpRead {
			k := key{in.Ledger, in.Entry}
			byKey[k] = append(byKey[k], op)
		}
	}
	var partitions [][]porcupine.Operation
	for ledger, ids := range entries {
		for e := range ids {
			ops := byKey[key{ledger, e}]
			for _, op := range wide[ledger] {
				copied := op
				in := op.Input.(Input)
				in.Entry = e
				copied.Input = in
				ops = append(ops, copied)
			}
			partitions = append(partitions, ops)
		}
	}
	return partitions
}
