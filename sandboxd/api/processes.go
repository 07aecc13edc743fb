package api

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/websocket"
	"go.uber.org/zap"
)

// Limits of a process start request.
const (
	maxArgs    = 256
	maxArgLen  = 8 << 10
	maxEnvVars = 128
)

type startProcessRequest struct {
	Cmd []string          `json:"cmd"`
	Cwd string            `json:"cwd"`
	Env map[string]string `json:"env"`
}

// processView is what the agent reports of a process, passed through after decoding (so nothing
// but these fields reaches the client).
type processView struct {
	Pid       int      `json:"pid"`
	Cmd       []string `json:"cmd"`
	Cwd       string   `json:"cwd"`
	State     string   `json:"state"`
	ExitCode  *int     `json:"exitCode"`
	StartedAt float64  `json:"startedAt"`
	EndedAt   *float64 `json:"endedAt"`
}

var signals = map[string]int{"TERM": 15, "KILL": 9, "INT": 2, "HUP": 1, "QUIT": 3, "USR1": 10, "USR2": 12}

func (s *Server) handleStartProcess(w http.ResponseWriter, r *http.Request) {
	owner, id := ownerFrom(r.Context()), r.PathValue("id")
	var req startProcessRequest
	if e := decodeJSON(w, r, 1<<20, &req); e != nil {
		s.fail(w, r, e)
		return
	}
	switch {
	case len(req.Cmd) == 0 || req.Cmd[0] == "":
		s.fail(w, r, badRequest("cmd is required: the program and its arguments, e.g. [\"node\", \"server.js\"]"))
		return
	case len(req.Cmd) > maxArgs:
		s.fail(w, r, badRequest("cmd has %d arguments; the limit is %d", len(req.Cmd), maxArgs))
		return
	case len(req.Env) > maxEnvVars:
		s.fail(w, r, badRequest("env has %d variables; the limit is %d", len(req.Env), maxEnvVars))
		return
	case req.Cwd != "" && !strings.HasPrefix(req.Cwd, "/"):
		s.fail(w, r, badRequest("cwd must be an absolute path inside the sandbox, e.g. /workspace/app"))
		return
	}
	for _, a := range req.Cmd {
		if len(a) > maxArgLen || strings.ContainsRune(a, 0) {
			s.fail(w, r, badRequest("each argument must be at most %d bytes, without NUL", maxArgLen))
			return
		}
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) || len(v) > maxArgLen {
			s.fail(w, r, badRequest("invalid env variable %q", k))
			return
		}
	}
	if _, err := s.sessions.Ready(r.Context(), owner, id); err != nil {
		s.fail(w, r, err)
		return
	}
	var p processView
	if err := s.rt.AgentCall(r.Context(), id, map[string]any{"op": "spawn", "cmd": req.Cmd, "cwd": req.Cwd, "env": req.Env}, &p, 10*time.Second); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, p)
}

func (s *Server) handleListProcesses(w http.ResponseWriter, r *http.Request) {
	owner, id := ownerFrom(r.Context()), r.PathValue("id")
	if _, err := s.sessions.Ready(r.Context(), owner, id); err != nil {
		s.fail(w, r, err)
		return
	}
	var out struct {
		Processes []processView `json:"processes"`
	}
	if err := s.rt.AgentCall(r.Context(), id, map[string]any{"op": "list"}, &out, 10*time.Second); err != nil {
		s.fail(w, r, err)
		return
	}
	if out.Processes == nil {
		out.Processes = []processView{}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) pid(w http.ResponseWriter, r *http.Request) (int, bool) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		s.fail(w, r, badRequest("pid must be a positive integer"))
		return 0, false
	}
	if _, err := s.sessions.Ready(r.Context(), ownerFrom(r.Context()), r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return 0, false
	}
	return pid, true
}

func (s *Server) handleGetProcess(w http.ResponseWriter, r *http.Request) {
	pid, ok := s.pid(w, r)
	if !ok {
		return
	}
	var p processView
	if err := s.rt.AgentCall(r.Context(), r.PathValue("id"), map[string]any{"op": "status", "pid": pid}, &p, 10*time.Second); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

func (s *Server) handleStopProcess(w http.ResponseWriter, r *http.Request) {
	pid, ok := s.pid(w, r)
	if !ok {
		return
	}
	name := strings.TrimPrefix(strings.ToUpper(r.URL.Query().Get("signal")), "SIG")
	if name == "" {
		name = "TERM"
	}
	sig, known := signals[name]
	if !known {
		s.fail(w, r, badRequest("unknown signal %q: use TERM, KILL, INT, HUP, QUIT, USR1 or USR2", name))
		return
	}
	var out map[string]any
	if err := s.rt.AgentCall(r.Context(), r.PathValue("id"), map[string]any{"op": "kill", "pid": pid, "signal": sig}, &out, 10*time.Second); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// logLine is one line of the agent's log answer.
type logLine struct {
	Stream    string `json:"stream,omitempty"`
	Data      string `json:"data,omitempty"`
	End       bool   `json:"end,omitempty"`
	ExitCode  *int   `json:"exitCode,omitempty"`
	Heartbeat bool   `json:"heartbeat,omitempty"`
}

var upgrader = websocket.Upgrader{
	ReadBufferSize: 4 << 10, WriteBufferSize: 32 << 10,
	// API clients are programs authenticated by x-api-key, not browsers with ambient credentials,
	// so the Origin check (a CSRF defence for cookie sessions) has nothing to protect here.
	CheckOrigin: func(*http.Request) bool { return true },
}

// handleLogs answers the last lines of a process's output, or follows it over a WebSocket.
func (s *Server) handleLogs(w http.ResponseWriter, r *http.Request) {
	pid, ok := s.pid(w, r)
	if !ok {
		return
	}
	tail := 0
	if t := r.URL.Query().Get("tail"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 0 || n > 100000 {
			s.fail(w, r, badRequest("tail must be a number of lines between 0 and 100000"))
			return
		}
		tail = n
	}
	follow := websocket.IsWebSocketUpgrade(r)
	timeout := 30 * time.Second
	if follow {
		timeout = 0
	}
	conn, err := s.rt.AgentDial(r.Context(), r.PathValue("id"), map[string]any{"op": "logs", "pid": pid, "tail": tail, "follow": follow}, timeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer conn.Close()
	first, err := conn.Next()
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var probe struct {
		AgentError string `json:"agentError"`
	}
	if json.Unmarshal(first, &probe) == nil && probe.AgentError != "" {
		writeError(w, r, http.StatusNotFound, CodeNotFound, "no such process")
		return
	}
	if !follow {
		out := map[string]any{"stdout": "", "stderr": "", "exitCode": nil}
		var sb = map[string]*strings.Builder{"stdout": {}, "stderr": {}}
		for line := first; ; {
			var l logLine
			if err := json.Unmarshal(line, &l); err != nil {
				break
			}
			if l.End {
				out["exitCode"] = l.ExitCode
				break
			}
			if b := sb[l.Stream]; b != nil {
				b.WriteString(l.Data)
			}
			if line, err = conn.Next(); err != nil {
				break
			}
		}
		out["stdout"], out["stderr"] = sb["stdout"].String(), sb["stderr"].String()
		writeJSON(w, http.StatusOK, out)
		return
	}
	ws, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader answered
	}
	defer ws.Close()
	// The client closing the socket ends the follow: read (and drop) its frames to notice.
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for {
			if _, _, err := ws.ReadMessage(); err != nil {
				conn.Close()
				return
			}
		}
	}()
	for line := first; ; {
		var l logLine
		if err := json.Unmarshal(line, &l); err != nil {
			break
		}
		if !l.Heartbeat {
			_ = ws.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if err := ws.WriteJSON(l); err != nil {
				return
			}
		}
		if l.End {
			_ = ws.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "process ended"))
			return
		}
		if line, err = conn.Next(); err != nil {
			s.loggerFrom(r.Context()).Debug("log follow ended", zap.Error(err))
			return
		}
	}
}
