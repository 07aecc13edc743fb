package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/porthole-dev/porthole/sandboxd/runtime"
	"github.com/porthole-dev/porthole/sandboxd/session"
	"github.com/porthole-dev/porthole/sandboxd/store"
	"go.uber.org/zap"
)

// sessionView is a session as the API shows it.
type sessionView struct {
	ID             string          `json:"id"`
	Language       string          `json:"language"`
	PreviewAccess  string          `json:"previewAccess"`
	Status         string          `json:"status"`
	StatusReason   string          `json:"statusReason,omitempty"`
	ThreadID       string          `json:"threadId,omitempty"`
	Metadata       json.RawMessage `json:"metadata"`
	TimeoutMs      int             `json:"timeoutMs"`
	IdleTimeoutSec int             `json:"idleTimeoutSec"`
	MaxLifetimeSec int             `json:"maxLifetimeSec"`
	CreatedAt      time.Time       `json:"createdAt"`
	LastActiveAt   time.Time       `json:"lastActiveAt"`
}

func viewOf(s *store.Session) sessionView {
	return sessionView{
		ID: s.ID, Language: s.Language, PreviewAccess: s.PreviewAccess, Status: s.Status, StatusReason: s.StatusReason,
		ThreadID: s.ThreadID, Metadata: json.RawMessage(s.Metadata), TimeoutMs: s.TimeoutMs,
		IdleTimeoutSec: s.IdleTimeoutSec, MaxLifetimeSec: s.MaxLifetimeSec, CreatedAt: s.CreatedAt.UTC(), LastActiveAt: s.LastActiveAt.UTC(),
	}
}

// createSessionRequest is the body of POST /sessions and POST /threads/{threadId}/start.
type createSessionRequest struct {
	Language       string          `json:"language"`
	PreviewAccess  string          `json:"previewAccess"`
	TimeoutMs      *int            `json:"timeoutMs"`
	IdleTimeoutSec *int            `json:"idleTimeoutSec"`
	MaxLifetimeSec *int            `json:"maxLifetimeSec"`
	ThreadID       string          `json:"threadId"`
	Metadata       json.RawMessage `json:"metadata"`
}

const maxMetadataBytes = 16 << 10

// validThreadID accepts 1–128 characters of [A-Za-z0-9._:@-]: thread ids appear in URL paths.
func validThreadID(t string) bool {
	if len(t) == 0 || len(t) > 128 {
		return false
	}
	for _, c := range t {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._:@-", c)) {
			return false
		}
	}
	return true
}

func (s *Server) parseCreate(req *createSessionRequest) (session.CreateOptions, *apiError) {
	cfg := s.sessions.Config()
	o := session.CreateOptions{Language: runtime.JavaScript, PreviewAccess: "private", Timeout: time.Duration(s.cfg.DefaultTimeoutMs) * time.Millisecond}
	if req.Language != "" {
		o.Language = runtime.Language(req.Language)
		if !o.Language.Valid() {
			return o, badRequest(`unknown language %q: use "javascript" or "python"`, req.Language)
		}
	}
	switch req.PreviewAccess {
	case "", "private", "public":
		if req.PreviewAccess != "" {
			o.PreviewAccess = req.PreviewAccess
		}
	default:
		return o, badRequest(`previewAccess must be "private" or "public", got %q`, req.PreviewAccess)
	}
	if req.TimeoutMs != nil {
		if *req.TimeoutMs <= 0 || *req.TimeoutMs > s.cfg.MaxTimeoutMs {
			return o, badRequest("timeoutMs must be between 1 and %d, got %d", s.cfg.MaxTimeoutMs, *req.TimeoutMs)
		}
		o.Timeout = time.Duration(*req.TimeoutMs) * time.Millisecond
	}
	if req.IdleTimeoutSec != nil {
		if max := int(cfg.MaxIdleTimeout.Seconds()); *req.IdleTimeoutSec <= 0 || *req.IdleTimeoutSec > max {
			return o, badRequest("idleTimeoutSec must be between 1 and %d, got %d", max, *req.IdleTimeoutSec)
		}
		o.IdleTimeout = time.Duration(*req.IdleTimeoutSec) * time.Second
	}
	if req.MaxLifetimeSec != nil {
		if max := int(cfg.MaxLifetime.Seconds()); *req.MaxLifetimeSec <= 0 || *req.MaxLifetimeSec > max {
			return o, badRequest("maxLifetimeSec must be between 1 and %d, got %d", max, *req.MaxLifetimeSec)
		}
		o.Lifetime = time.Duration(*req.MaxLifetimeSec) * time.Second
	}
	if req.ThreadID != "" && !validThreadID(req.ThreadID) {
		return o, badRequest("threadId must be 1 to 128 characters of letters, digits and . _ : @ -")
	}
	o.ThreadID = req.ThreadID
	if md := bytes.TrimSpace(req.Metadata); len(md) > 0 && !bytes.Equal(md, []byte("null")) {
		if md[0] != '{' {
			return o, badRequest("metadata must be a JSON object")
		}
		if len(md) > maxMetadataBytes {
			return o, badRequest("metadata is %d bytes of JSON; the limit is %d", len(md), maxMetadataBytes)
		}
		o.Metadata = md
	}
	return o, nil
}

// fail answers err with the error model, mapping the session and runtime errors.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	var agentErr *runtime.AgentError
	switch {
	case errors.As(err, &ae):
		if ae.status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		writeError(w, r, ae.status, ae.code, ae.message)
	case errors.Is(err, session.ErrNotFound):
		writeError(w, r, http.StatusNotFound, CodeNotFound, "no such session")
	case errors.Is(err, session.ErrLost):
		writeError(w, r, http.StatusConflict, CodeConflict, "the session's sandbox was lost; delete it and create a new one")
	case errors.Is(err, session.ErrLimit):
		w.Header().Set("Retry-After", "60")
		writeError(w, r, http.StatusTooManyRequests, CodeRateLimited, err.Error())
	case errors.Is(err, store.ErrConflict):
		writeError(w, r, http.StatusConflict, CodeConflict, "that threadId already has a session; use POST /threads/{threadId}/start")
	case errors.Is(err, session.ErrBadPath):
		writeError(w, r, http.StatusBadRequest, CodeInvalidArgument, err.Error())
	case errors.Is(err, session.ErrNoFile):
		writeError(w, r, http.StatusNotFound, CodeNotFound, "no such file or folder in /workspace")
	case errors.Is(err, session.ErrIsDir):
		writeError(w, r, http.StatusConflict, CodeConflict, err.Error())
	case errors.Is(err, session.ErrTooLarge):
		writeError(w, r, http.StatusRequestEntityTooLarge, CodeTooLarge, err.Error())
	case errors.As(err, &agentErr):
		switch agentErr.Code {
		case "not_found":
			writeError(w, r, http.StatusNotFound, CodeNotFound, "no such process")
		case "limit":
			w.Header().Set("Retry-After", "5")
			writeError(w, r, http.StatusTooManyRequests, CodeRateLimited, agentErr.Message)
		default:
			writeError(w, r, http.StatusBadRequest, CodeInvalidArgument, agentErr.Message)
		}
	case errors.Is(err, runtime.ErrNotRunning):
		writeError(w, r, http.StatusServiceUnavailable, CodeUnavailable, "the session's sandbox is not answering; retry, or delete and recreate the session")
	default:
		s.loggerFrom(r.Context()).Error("request failed", zap.Error(err))
		writeError(w, r, http.StatusInternalServerError, CodeInternal, "internal error; report the request id")
	}
}

func (s *Server) handleCreateSession(w http.ResponseWriter, r *http.Request) {
	var req createSessionRequest
	if e := decodeJSON(w, r, 64<<10, &req); e != nil {
		s.fail(w, r, e)
		return
	}
	o, e := s.parseCreate(&req)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	ses, err := s.sessions.Create(r.Context(), ownerFrom(r.Context()), o)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, viewOf(ses))
}

func (s *Server) handleListSessions(w http.ResponseWriter, r *http.Request) {
	list, err := s.sessions.List(r.Context(), ownerFrom(r.Context()))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]sessionView, 0, len(list))
	for _, ses := range list {
		out = append(out, viewOf(ses))
	}
	writeJSON(w, http.StatusOK, map[string]any{"sessions": out})
}

func (s *Server) handleGetSession(w http.ResponseWriter, r *http.Request) {
	ses, err := s.sessions.Get(r.Context(), ownerFrom(r.Context()), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(ses))
}

func (s *Server) handleDeleteSession(w http.ResponseWriter, r *http.Request) {
	if err := s.sessions.Delete(r.Context(), ownerFrom(r.Context()), r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleExecute(w http.ResponseWriter, r *http.Request) {
	owner, id := ownerFrom(r.Context()), r.PathValue("id")
	var req runRequest
	if e := decodeJSON(w, r, s.maxRunBody(), &req); e != nil {
		s.fail(w, r, e)
		return
	}
	ses, err := s.sessions.Get(r.Context(), owner, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Language == "" {
		req.Language = ses.Language
	}
	if req.TimeoutMs == nil {
		t := ses.TimeoutMs
		req.TimeoutMs = &t
	}
	lang, run, e := s.validateRun(&req, false)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	release, ae := s.admit(r.Context())
	if ae != nil {
		s.fail(w, r, ae)
		return
	}
	defer release()
	res, _, err := s.sessions.Execute(r.Context(), owner, id, lang, run)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.account(r.Context(), runtime.NewID(), owner, "session", lang, res)
	writeJSON(w, http.StatusOK, responseOf(id, res, run.State))
}

// responseOf shapes a run's answer; keep is the state returned when the run left none.
func responseOf(id string, res *runtime.RunResult, keep json.RawMessage) *runResponse {
	state := res.State
	if len(state) == 0 || bytes.Equal(state, []byte("null")) {
		state = keep
		if len(state) == 0 {
			state = json.RawMessage("{}")
		}
	}
	result := res.Result
	if result == nil {
		result = json.RawMessage("null")
	}
	return &runResponse{
		ID: id, OK: res.OK, Result: result, Stdout: res.Stdout, Stderr: res.Stderr,
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
		DurationMs: float64(res.Duration.Microseconds()) / 1000, TimedOut: res.TimedOut, Error: res.Error, State: state,
	}
}

func (s *Server) handleGetThread(w http.ResponseWriter, r *http.Request) {
	t := r.PathValue("threadId")
	if !validThreadID(t) {
		s.fail(w, r, badRequest("threadId must be 1 to 128 characters of letters, digits and . _ : @ -"))
		return
	}
	ses, err := s.sessions.Thread(r.Context(), ownerFrom(r.Context()), t)
	if err != nil {
		if errors.Is(err, session.ErrNotFound) {
			writeError(w, r, http.StatusNotFound, CodeNotFound, "no sandbox is linked to this thread; POST /threads/{threadId}/start makes one")
			return
		}
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(ses))
}

func (s *Server) handleStartThread(w http.ResponseWriter, r *http.Request) {
	t := r.PathValue("threadId")
	if !validThreadID(t) {
		s.fail(w, r, badRequest("threadId must be 1 to 128 characters of letters, digits and . _ : @ -"))
		return
	}
	var req createSessionRequest
	if r.ContentLength != 0 {
		if e := decodeJSON(w, r, 64<<10, &req); e != nil && !strings.Contains(e.message, "empty") {
			s.fail(w, r, e)
			return
		}
	}
	if req.ThreadID != "" && req.ThreadID != t {
		s.fail(w, r, badRequest("threadId in the body differs from the path"))
		return
	}
	o, e := s.parseCreate(&req)
	if e != nil {
		s.fail(w, r, e)
		return
	}
	ses, created, err := s.sessions.StartThread(r.Context(), ownerFrom(r.Context()), t, o)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, viewOf(ses))
}

func (s *Server) handlePreviews(w http.ResponseWriter, r *http.Request) {
	owner, id := ownerFrom(r.Context()), r.PathValue("id")
	if _, err := s.sessions.Ready(r.Context(), owner, id); err != nil {
		s.fail(w, r, err)
		return
	}
	ports, err := s.rt.ListeningPorts(r.Context(), id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	type preview struct {
		Port int    `json:"port"`
		URL  string `json:"url"`
	}
	out := make([]preview, 0, len(ports))
	for _, p := range ports {
		out = append(out, preview{Port: p, URL: s.PreviewURL(id, p)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"previews": out})
}

// PreviewURL is https://<port>-<id>.<preview-domain>, with the edge's port unless it is 443.
func (s *Server) PreviewURL(id string, port int) string {
	u := fmt.Sprintf("https://%d-%s.%s", port, id, s.cfg.PreviewDomain)
	if s.cfg.PreviewPort != 0 && s.cfg.PreviewPort != 443 {
		u += ":" + strconv.Itoa(s.cfg.PreviewPort)
	}
	return u + "/"
}

// ---- files

func (s *Server) handleGetFile(w http.ResponseWriter, r *http.Request) {
	f, list, err := s.sessions.ReadFile(r.Context(), ownerFrom(r.Context()), r.PathValue("id"), r.PathValue("path"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if list != nil {
		writeJSON(w, http.StatusOK, map[string]any{"entries": list})
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	_, _ = io.Copy(w, f)
}

func (s *Server) handlePutFile(w http.ResponseWriter, r *http.Request) {
	max := int64(s.cfg.MaxFileBytes)
	if r.ContentLength > max {
		s.fail(w, r, &apiError{http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("the file is %d bytes; the limit is %d", r.ContentLength, max)})
		return
	}
	uid, gid := s.rt.SandboxUser()
	n, err := s.sessions.WriteFile(r.Context(), ownerFrom(r.Context()), r.PathValue("id"), r.PathValue("path"), http.MaxBytesReader(w, r.Body, max+1), max, uid, gid)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = &apiError{http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("the file is over the limit of %d bytes", max)}
		}
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"path": strings.TrimSuffix(r.PathValue("path"), "/"), "size": n})
}

func (s *Server) handleDeleteFile(w http.ResponseWriter, r *http.Request) {
	if err := s.sessions.DeleteFile(r.Context(), ownerFrom(r.Context()), r.PathValue("id"), r.PathValue("path")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
