package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/porthole-dev/porthole/sandboxd/runtime"
	"github.com/porthole-dev/porthole/sandboxd/store"
	"go.uber.org/zap"
)

// runRequest is the body of POST /api/v1/sandbox/ephemeral.
type runRequest struct {
	Language  string          `json:"language"`
	Source    *string         `json:"source"`
	State     json.RawMessage `json:"state"`
	TimeoutMs *int            `json:"timeoutMs"`
	ThreadID  string          `json:"threadId"`
	MessageID string          `json:"messageId"`
}

// runResponse is a run's answer (docs/API.md).
type runResponse struct {
	ID              string            `json:"id"`
	OK              bool              `json:"ok"`
	Result          json.RawMessage   `json:"result"`
	Stdout          string            `json:"stdout"`
	Stderr          string            `json:"stderr"`
	StdoutTruncated bool              `json:"stdoutTruncated"`
	StderrTruncated bool              `json:"stderrTruncated"`
	DurationMs      float64           `json:"durationMs"`
	TimedOut        bool              `json:"timedOut"`
	Error           *runtime.RunError `json:"error"`
	State           json.RawMessage   `json:"state"`
}

// apiError is a request failure to answer with the error model.
type apiError struct {
	status  int
	code    string
	message string
}

func (e *apiError) Error() string { return e.message }

func badRequest(format string, args ...any) *apiError {
	return &apiError{http.StatusBadRequest, CodeInvalidArgument, fmt.Sprintf(format, args...)}
}

// decodeJSON reads one JSON object from the body, bounded by maxBytes, rejecting unknown fields.
func decodeJSON(w http.ResponseWriter, r *http.Request, maxBytes int64, v any) *apiError {
	// The body is parsed as JSON whatever its Content-Type says, so `curl -d` works; a body that is not
	// JSON gets a precise 400.
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &tooBig):
			return &apiError{http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("request body exceeds %d bytes", maxBytes)}
		case errors.Is(err, io.EOF):
			return badRequest("request body is empty; send a JSON object")
		case errors.As(err, &syn):
			return badRequest("malformed JSON at byte %d: %v", syn.Offset, err)
		case errors.As(err, &typ):
			return badRequest("field %q must be %s, not %s", typ.Field, typ.Type, typ.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return badRequest("%s", strings.TrimPrefix(err.Error(), "json: "))
		default:
			return badRequest("malformed JSON: %v", err)
		}
	}
	if dec.More() {
		return badRequest("request body has data after the JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("request body has data after the JSON object")
	}
	return nil
}

// validateRun checks a run request against the limits and returns the run to do.
func (s *Server) validateRun(req *runRequest, needLanguage bool) (runtime.Language, runtime.RunRequest, *apiError) {
	limits := s.rt.Limits()
	lang := runtime.Language(req.Language)
	if req.Language == "" && needLanguage {
		return "", runtime.RunRequest{}, badRequest(`language is required: "javascript" or "python"`)
	}
	if !lang.Valid() {
		return "", runtime.RunRequest{}, badRequest(`unknown language %q: use "javascript" or "python"`, req.Language)
	}
	if req.Source == nil || strings.TrimSpace(*req.Source) == "" {
		return "", runtime.RunRequest{}, badRequest("source is required and must not be empty")
	}
	if n := len(*req.Source); n > s.cfg.MaxSourceBytes {
		return "", runtime.RunRequest{}, badRequest("source is %d bytes; the limit is %d", n, s.cfg.MaxSourceBytes)
	}
	state := bytes.TrimSpace(req.State)
	if len(state) > 0 && !bytes.Equal(state, []byte("null")) {
		if state[0] != '{' {
			return "", runtime.RunRequest{}, badRequest("state must be a JSON object")
		}
		if len(state) > limits.StateBytes {
			return "", runtime.RunRequest{}, badRequest("state is %d bytes of JSON; the limit is %d", len(state), limits.StateBytes)
		}
	} else {
		state = nil
	}
	timeout := s.cfg.DefaultTimeoutMs
	if req.TimeoutMs != nil {
		timeout = *req.TimeoutMs
		if timeout <= 0 || timeout > s.cfg.MaxTimeoutMs {
			return "", runtime.RunRequest{}, badRequest("timeoutMs must be between 1 and %d, got %d", s.cfg.MaxTimeoutMs, timeout)
		}
	}
	for name, v := range map[string]string{"threadId": req.ThreadID, "messageId": req.MessageID} {
		if len(v) > 128 {
			return "", runtime.RunRequest{}, badRequest("%s is %d characters; the limit is 128", name, len(v))
		}
	}
	return lang, runtime.RunRequest{Source: *req.Source, State: state, Timeout: time.Duration(timeout) * time.Millisecond}, nil
}

// maxRunBody is the largest run request body: source and state at their limits plus room for the rest.
func (s *Server) maxRunBody() int64 {
	return int64(s.cfg.MaxSourceBytes+s.rt.Limits().StateBytes) + 64<<10
}

func (s *Server) handleEphemeral(w http.ResponseWriter, r *http.Request) {
	var req runRequest
	if e := decodeJSON(w, r, s.maxRunBody(), &req); e != nil {
		writeError(w, r, e.status, e.code, e.message)
		return
	}
	lang, run, e := s.validateRun(&req, true)
	if e != nil {
		writeError(w, r, e.status, e.code, e.message)
		return
	}
	resp, e := s.runEphemeral(r.Context(), ownerFrom(r.Context()), lang, run)
	if e != nil {
		s.fail(w, r, e) // sets Retry-After on a 429
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// admit takes a run slot (waiting in the queue if need be), or says why not: 429 when every slot
// and queue place is taken. The returned func gives the slot back.
func (s *Server) admit(ctx context.Context) (func(), *apiError) {
	release, err := s.limiter.acquire(ctx)
	if errors.Is(err, errQueueFull) {
		return nil, &apiError{http.StatusTooManyRequests, CodeRateLimited,
			fmt.Sprintf("all %d run slots and %d queue places are taken; retry after the Retry-After delay", s.cfg.MaxParallelRuns, s.cfg.MaxQueuedRuns)}
	}
	if err != nil {
		return nil, &apiError{http.StatusServiceUnavailable, CodeUnavailable, "request canceled while queued"}
	}
	return release, nil
}

// account counts a finished run in /metrics and appends it to the owner's run log.
func (s *Server) account(ctx context.Context, id, owner, kind string, lang runtime.Language, res *runtime.RunResult) {
	s.metrics.runs.WithLabelValues(string(lang), res.Outcome).Inc()
	s.metrics.runDuration.WithLabelValues(string(lang)).Observe(res.Duration.Seconds())
	if err := s.store.RecordRun(context.WithoutCancel(ctx), store.Run{
		ID: id, Owner: owner, Kind: kind, Language: string(lang), Outcome: res.Outcome,
		DurationMs: res.Duration.Milliseconds(), CreatedAt: time.Now(),
	}); err != nil {
		s.loggerFrom(ctx).Error("record run", zap.Error(err))
	}
}

// runEphemeral runs code once in a fresh sandbox that nothing else ever uses.
func (s *Server) runEphemeral(ctx context.Context, owner string, lang runtime.Language, run runtime.RunRequest) (*runResponse, *apiError) {
	log := s.loggerFrom(ctx)
	release, e := s.admit(ctx)
	if e != nil {
		return nil, e
	}
	defer release()

	sb, err := s.pool.Get(ctx, lang)
	if err != nil {
		log.Error("start sandbox", zap.Error(err))
		return nil, &apiError{http.StatusServiceUnavailable, CodeUnavailable, "could not start a sandbox; retry shortly (the server log has the cause)"}
	}
	res, err := sb.Run(ctx, run)
	if err != nil {
		s.metrics.runs.WithLabelValues(string(lang), "canceled").Inc()
		return nil, &apiError{http.StatusServiceUnavailable, CodeUnavailable, "the run was canceled before it finished"}
	}
	s.account(ctx, sb.ID, owner, "ephemeral", lang, res)
	log.Debug("run", zap.String("sandbox", sb.ID), zap.String("language", string(lang)), zap.String("outcome", res.Outcome), zap.Duration("duration", res.Duration))

	// A run that left no state (it died, or its state was refused) returns the state it started
	// with, unchanged, so nothing is lost.
	return responseOf(sb.ID, res, run.State), nil
}
