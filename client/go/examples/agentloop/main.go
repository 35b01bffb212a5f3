// agentloop runs an agent loop against a running ctxcc: append -> compile over the
// stream -> call a fake provider -> queue its usage for the next step -> append the reply:
// one round trip per step.
//
//	CTXCC_TARGET=unix:///run/ctxcc/ctxcc.sock go run ./examples/agentloop -steps 20
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	ctxcc "github.com/ctxcc/ctxcc/client/go"
	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

func main() {
	steps := flag.Int("steps", 20, "agent steps to run")
	big := flag.Int("big-step", -1, "at this step, append ~5 MB of user text (a chunked view)")
	pauseAt := flag.Int("pause-at", -1, "after this step, print 'paused' and wait for -resume-file")
	resumeFile := flag.String("resume-file", "", "file whose creation ends the pause")
	flag.Parse()
	target := os.Getenv("CTXCC_TARGET")
	if target == "" {
		target = "127.0.0.1:50551"
	}
	if err := run(target, *steps, *big, *pauseAt, *resumeFile); err != nil {
		fmt.Fprintln(os.Stderr, "agentloop:", err)
		os.Exit(1)
	}
}

func run(target string, steps, big, pauseAt int, resumeFile string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := ctxcc.Dial(target)
	if err != nil {
		return err
	}
	defer c.Close()
	session, err := c.CreateSession(ctx, &ctxccv1.Session{})
	if err != nil {
		return err
	}
	fmt.Printf("session %s\n", session.GetSessionId())
	route := &ctxccv1.Route{Connection: "example", Protocol: "fake", Endpoint: "local", Model: "gpt-4o"}
	stream := c.OpenStream(ctx)
	defer stream.Close()
	pending := []*ctxccv1.Event{ctxcc.User("start the task")}
	var view *ctxccv1.CompiledView
	largest := 0
	carried := 0 // steps whose answer says the usage they carried was recorded
	for step := 0; step < steps; step++ {
		if step == big {
			for i := 0; i < 6; i++ {
				pending = append(pending, ctxcc.User(strings.Repeat(fmt.Sprintf("chunk %d line. ", i), 60000)))
			}
		}
		req := &ctxccv1.CompileRequest{SessionId: session.GetSessionId(), Route: route}
		started := time.Now()
		var appended *ctxccv1.AppendResult
		view, appended, err = stream.Step(req, pending, "")
		if err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		fmt.Printf("step %d append %d-%d replayed %t ms %.2f estimate %d\n", step, appended.GetFirstSeq(), appended.GetLastSeq(),
			appended.GetReplayed(), float64(time.Since(started).Microseconds())/1000, view.GetBudget().GetEstimatedInputTokens())
		size := 0
		for _, m := range view.GetMessages() {
			for _, p := range m.GetParts() {
				size += len(p.GetText())
			}
		}
		largest = max(largest, size)
		if u := stream.LastUsage(); u != nil && !u.GetReplayed() {
			carried++
		}
		// A fake provider's count of the request it was sent (about 4 characters a token, a
		// few per message), as a real provider counts: never ctxcc's estimate with a margin,
		// which compounds step after step (the estimate after a report is that report plus
		// what is new). Rides on the next step (the last one goes by ReportUsage at Close).
		inputTokens := uint32((size+len(view.GetSystemPrompt()))/4 + 4*len(view.GetMessages()) + 7)
		_, err = stream.ReportUsage(ctx, &ctxccv1.ReportUsageRequest{CompileId: view.GetCompileId(),
			Route: route, InputTokens: inputTokens, OutputTokens: uint32(40 + step)})
		if err != nil {
			return fmt.Errorf("usage %d: %w", step, err)
		}
		pending = []*ctxccv1.Event{ctxcc.Assistant(fmt.Sprintf("reply %d", step)), ctxcc.User(fmt.Sprintf("next step %d", step+1))}
		if step == pauseAt {
			fmt.Println("paused")
			for {
				if _, err := os.Stat(resumeFile); err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	_, err = c.Sessions.GetSession(ctx, &ctxccv1.GetSessionRequest{SessionId: "no-such-session"})
	e, _ := ctxcc.AsError(err)
	if err := stream.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	stats := stream.Stats()
	fmt.Printf("ok %d steps session %s seq %d largest_view_bytes %d missing_reason %s usage_carried %d whole %d deltas %d mismatches %d\n",
		steps, session.GetSessionId(), view.GetEventBoundary(), largest, e.Reason, carried, stats.Whole, stats.Deltas, stats.Mismatches)
	return nil
}
