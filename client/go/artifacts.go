package ctxcc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/ctxcc/ctxcc/client/go/ctxccv1"
)

const chunkSize = 1 << 20

// UploadArtifact uploads bytes (e.g. an image) and returns the ref to put in a message
// (see UserWith). Its request id is fixed before the first attempt, so a retry on
// Unavailable is answered with what the first attempt stored, never stored twice.
func (c *Client) UploadArtifact(ctx context.Context, sessionID string, data []byte, mimeType string, width, height uint32) (*ctxccv1.ArtifactRef, error) {
	sum := sha256.Sum256(data)
	header := &ctxccv1.ArtifactHeader{SessionId: sessionID, MimeType: mimeType, SizeBytes: uint64(len(data)),
		Sha256: hex.EncodeToString(sum[:]), Width: width, Height: height, RequestId: NewRequestID()}
	return retry(ctx, c.RetryFor, func() (*ctxccv1.ArtifactRef, error) {
		up, err := c.Artifacts.UploadArtifact(ctx)
		if err != nil {
			return nil, err
		}
		err = up.Send(&ctxccv1.UploadArtifactRequest{Chunk: &ctxccv1.UploadArtifactRequest_Header{Header: header}})
		for start := 0; err == nil && start < len(data); start += chunkSize {
			part := data[start:min(start+chunkSize, len(data))]
			err = up.Send(&ctxccv1.UploadArtifactRequest{Chunk: &ctxccv1.UploadArtifactRequest_Data{Data: part}})
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
		resp, err := up.CloseAndRecv() // on a failed Send the real status is here
		if err != nil {
			return nil, err
		}
		return resp.GetArtifact(), nil
	})
}

// DownloadArtifact returns an artifact's ref and bytes, checked against its sha256.
func (c *Client) DownloadArtifact(ctx context.Context, sessionID, artifactID string) (*ctxccv1.ArtifactRef, []byte, error) {
	type result struct {
		ref  *ctxccv1.ArtifactRef
		data []byte
	}
	req := &ctxccv1.DownloadArtifactRequest{SessionId: sessionID, ArtifactId: artifactID}
	r, err := retry(ctx, c.RetryFor, func() (result, error) {
		down, err := c.Artifacts.DownloadArtifact(ctx, req)
		if err != nil {
			return result{}, err
		}
		var out result
		var buf bytes.Buffer
		for {
			msg, err := down.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				return result{}, err
			}
			if ref := msg.GetArtifact(); ref != nil {
				out.ref = ref
			}
			buf.Write(msg.GetData())
		}
		out.data = buf.Bytes()
		return out, nil
	})
	if err != nil {
		return nil, nil, err
	}
	sum := sha256.Sum256(r.data)
	if r.ref == nil || hex.EncodeToString(sum[:]) != r.ref.GetSha256() {
		return nil, nil, fmt.Errorf("artifact %s arrived damaged", artifactID)
	}
	return r.ref, r.data, nil
}

// Watch calls fn with each update of a session after afterSeq until fn returns false or ctx
// ends. After a daemon restart it reopens from the last event it delivered, so no event is
// delivered twice or skipped. A session deleted (and perhaps made again under its id) while
// the watch was away ends it with NOT_FOUND (SESSION_NOT_FOUND), as an open watch ends: the
// daemon's header names the create time of the session each watch follows, and a reopened
// watch that follows another one ends so, even when nothing was delivered yet. The reopened
// watch also asks for the last event it delivered again, and a log without that very event
// (its id and time) is another session's, never followed as if it went on (the check left
// with a daemon that sends no such header).
func (c *Client) Watch(ctx context.Context, sessionID string, afterSeq uint64, fn func(*ctxccv1.WatchSessionResponse) bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	deadline := time.Now().Add(c.RetryFor)
	pause := 50 * time.Millisecond
	var last *ctxccv1.Event // the last event delivered
	made := ""              // the create time of the session watched, from a header
	for {
		// From the second call on, start one event early: the first event answered must be
		// the one delivered last, or the log is no longer the one watched.
		anchor, start := last, afterSeq
		if anchor != nil {
			start = afterSeq - 1
		}
		w, err := c.Sessions.WatchSession(ctx, &ctxccv1.WatchSessionRequest{SessionId: sessionID, AfterSeq: start})
		if err == nil {
			// Sent once the daemon subscribed (by an older daemon: with the first update, or
			// none at the end). An error here is the stream's: Recv answers it below.
			if md, herr := w.Header(); herr == nil {
				now := created(md)
				if made == "" {
					made = now
				} else if now != "" && now != made {
					return sessionGone(sessionID)
				}
			}
		}
		for err == nil {
			var msg *ctxccv1.WatchSessionResponse
			if msg, err = w.Recv(); err != nil {
				break
			}
			if anchor != nil {
				if !sameEvent(msg.GetEvent(), anchor) {
					return sessionGone(sessionID)
				}
				anchor = nil
				continue
			}
			if ev := msg.GetEvent(); ev != nil {
				afterSeq, last = ev.GetSeq(), ev
			}
			deadline, pause = time.Now().Add(c.RetryFor), 50*time.Millisecond
			if !fn(msg) {
				return nil
			}
		}
		if err == io.EOF {
			return nil
		}
		if e, ok := AsError(err); ok && anchor != nil && e.Reason == "SEQ_OUT_OF_RANGE" {
			return sessionGone(sessionID) // a shorter log: another one
		}
		if !(retryable(ctx, err) || transientQuota(err)) || time.Now().After(deadline) {
			return wrap(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, maxPause)
	}
}

// SessionCreateTimeKey is WatchSession's response header: the create time (ns since the
// epoch, decimal) of the session the watch follows.
const SessionCreateTimeKey = "ctxcc-session-create-time-ns"

// created is the create time of the session a watch follows, from its header ("": not sent).
func created(md metadata.MD) string {
	if v := md.Get(SessionCreateTimeKey); len(v) > 0 {
		return v[0]
	}
	return ""
}

// sameEvent: the same event of the same log (its seq, its id, the time the daemon wrote it).
func sameEvent(got, want *ctxccv1.Event) bool {
	return got != nil && got.GetSeq() == want.GetSeq() && got.GetEventId() == want.GetEventId() &&
		proto.Equal(got.GetCreateTime(), want.GetCreateTime())
}

func sessionGone(sessionID string) error {
	return &Error{
		Code:     codes.NotFound,
		Reason:   "SESSION_NOT_FOUND",
		Message:  fmt.Sprintf("session %q was deleted while the watch was reconnecting", sessionID),
		Metadata: map[string]string{"session_id": sessionID},
	}
}

// UserWith is a user message with uploaded artifacts (e.g. images) after its text.
func UserWith(text string, refs ...*ctxccv1.ArtifactRef) *ctxccv1.Event {
	ev := User(text)
	msg := ev.GetUserMessage()
	for _, ref := range refs {
		msg.Parts = append(msg.Parts, &ctxccv1.ContentPart{Part: &ctxccv1.ContentPart_Attachment{Attachment: ref}})
	}
	return ev
}

// ToolCalls is an assistant message that calls tools; calls are {callID, name, argumentsJSON}.
func ToolCalls(text string, calls ...[3]string) *ctxccv1.Event {
	ev := Assistant(text)
	msg := ev.GetAssistantMessage()
	if text == "" {
		msg.Parts = nil
	}
	for _, call := range calls {
		msg.ToolCalls = append(msg.ToolCalls, &ctxccv1.ToolCall{CallId: call[0], Name: call[1], ArgumentsJson: call[2]})
	}
	return ev
}

// ToolResult is the text result of a tool call.
func ToolResult(callID, toolName, text string, isError bool) *ctxccv1.Event {
	return &ctxccv1.Event{Payload: &ctxccv1.Event_ToolResult{ToolResult: &ctxccv1.ToolResult{
		CallId: callID, ToolName: toolName, IsError: isError, Content: &ctxccv1.ToolResult_Text{Text: text}}}}
}
