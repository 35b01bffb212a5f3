// checkpointdigest prints the covered_digest of events 1..N of a session, computed on
// the client from ListEvents, as a checkpoint created in COVERED_DIGEST_MODE_VERIFY
// must carry it.
//
//	CTXCC_TARGET=unix:///run/ctxcc/ctxcc.sock go run ./examples/checkpointdigest -session s1 -through 12
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	ctxcc "github.com/ctxcc/ctxcc/client/go"
	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

func main() {
	session := flag.String("session", "", "session id")
	through := flag.Uint64("through", 0, "last seq covered")
	flag.Parse()
	target := os.Getenv("CTXCC_TARGET")
	if target == "" {
		target = "127.0.0.1:50551"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := ctxcc.Dial(target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "checkpointdigest:", err)
		os.Exit(1)
	}
	defer c.Close()
	var events []*ctxccv1.Event
	req := &ctxccv1.ListEventsRequest{SessionId: *session, PageSize: 1000}
	for {
		page, err := c.Sessions.ListEvents(ctx, req)
		if err != nil {
			fmt.Fprintln(os.Stderr, "checkpointdigest:", err)
			os.Exit(1)
		}
		for _, ev := range page.GetEvents() {
			if ev.GetSeq() <= *through {
				events = append(events, ev)
			}
		}
		if page.GetNextPageToken() == "" {
			break
		}
		req.PageToken = page.GetNextPageToken()
	}
	digest, err := ctxcc.CoveredDigest(events)
	if err != nil {
		fmt.Fprintln(os.Stderr, "checkpointdigest:", err)
		os.Exit(1)
	}
	fmt.Println(digest)
}
