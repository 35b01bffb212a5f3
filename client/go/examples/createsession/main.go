// createsession creates one session and prints it, or the error it got: how a CreateSession
// waits out a daemon that is restarting (see "Retries" in the README).
//
//	CTXCC_TARGET=unix:///run/ctxcc/ctxcc.sock go run ./examples/createsession \
//	  -session '{"project_id": "p1", "labels": {"team": "infra"}}' -retry-seconds 30
//
// Prints `created {json}` (the session's id and creation fields) or `error CODE REASON` and
// exits 1.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	ctxcc "github.com/ctxcc/ctxcc/client/go"
	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

func main() {
	fields := flag.String("session", "{}", "the session to create, as JSON (Session fields)")
	retrySeconds := flag.Float64("retry-seconds", ctxcc.DefaultRetryFor.Seconds(), "how long to wait out an unavailable daemon")
	flag.Parse()
	target := os.Getenv("CTXCC_TARGET")
	if target == "" {
		target = "127.0.0.1:50551"
	}
	asked := &ctxccv1.Session{}
	if err := protojson.Unmarshal([]byte(*fields), asked); err != nil {
		fmt.Fprintln(os.Stderr, "createsession:", err)
		os.Exit(2)
	}
	c, err := ctxcc.Dial(target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "createsession:", err)
		os.Exit(2)
	}
	defer c.Close()
	c.RetryFor = time.Duration(*retrySeconds * float64(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), c.RetryFor+time.Minute)
	defer cancel()
	s, err := c.CreateSession(ctx, asked)
	if err != nil {
		if e, ok := ctxcc.AsError(err); ok {
			fmt.Printf("error %s %s\n", e.Code, e.Reason)
		} else {
			fmt.Println("error", err)
		}
		os.Exit(1)
	}
	labels := s.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	line, _ := json.Marshal(map[string]any{ // keys come out sorted
		"session_id": s.GetSessionId(), "workspace_id": s.GetWorkspaceId(), "project_id": s.GetProjectId(),
		"labels": labels, "project_root": s.GetProjectRoot(), "working_directory": s.GetWorkingDirectory(),
	})
	fmt.Println("created " + string(line))
}
