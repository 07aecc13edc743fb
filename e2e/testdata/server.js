// A test app for the edge: plain HTTP, server-sent events, and a WebSocket echo, with no
// dependencies (the WebSocket framing is done by hand). Usage: node server.js NAME [PORT]
'use strict';
const http = require('http');
const crypto = require('crypto');
const fs = require('fs');
const name = process.argv[2] || 'app';
const port = Number(process.argv[3] || 3000);

const srv = http.createServer((req, res) => {
  if (req.url === '/sse') {
    // Event "one" now; event "two" only once /workspace/go exists, so a client that has read "one"
    // proves the stream is not buffered.
    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
    res.write('data: one\n\n');
    const t = setInterval(() => {
      if (fs.existsSync('/workspace/go')) {
        clearInterval(t);
        res.write('data: two\n\n');
        res.end();
      }
    }, 50);
    req.on('close', () => clearInterval(t));
    return;
  }
  res.writeHead(200, {
    'Content-Type': 'text/plain',
    'X-Seen-Host': req.headers.host || '',
    'X-Seen-Forwarded-Host': req.headers['x-forwarded-host'] || '',
    'X-Seen-Forwarded': req.headers['forwarded'] || '',
  });
  res.end('hello from ' + name);
});

srv.on('upgrade', (req, sock) => {
  const accept = crypto.createHash('sha1').update(req.headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
  sock.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + accept + '\r\n\r\n');
  let buf = Buffer.alloc(0);
  let msgOp = 0;
  let parts = [];
  sock.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
    for (;;) {
      if (buf.length < 2) return;
      const fin = (buf[0] & 0x80) !== 0;
      const op = buf[0] & 0x0f;
      let len = buf[1] & 0x7f;
      let off = 2;
      if (len === 126) { if (buf.length < 4) return; len = buf.readUInt16BE(2); off = 4; }
      else if (len === 127) { if (buf.length < 10) return; len = Number(buf.readBigUInt64BE(2)); off = 10; }
      const masked = (buf[1] & 0x80) !== 0;
      const mask = masked ? buf.subarray(off, off + 4) : null;
      if (masked) off += 4;
      if (buf.length < off + len) return;
      const payload = Buffer.from(buf.subarray(off, off + len));
      if (mask) for (let i = 0; i < len; i++) payload[i] ^= mask[i % 4];
      buf = buf.subarray(off + len);
      if (op === 8) { sock.end(); return; }
      if (op === 1 || op === 2 || op === 0) {
        // A message may come in fragments (a first frame, then continuations): echo it whole.
        if (op !== 0) { msgOp = op; parts = []; }
        parts.push(payload);
        if (!fin) continue;
        const whole = Buffer.concat(parts);
        const len = whole.length;
        const op2 = msgOp;
        let hdr;
        if (len < 126) hdr = Buffer.from([0x80 | op2, len]);
        else if (len < 65536) { hdr = Buffer.alloc(4); hdr[0] = 0x80 | op2; hdr[1] = 126; hdr.writeUInt16BE(len, 2); }
        else { hdr = Buffer.alloc(10); hdr[0] = 0x80 | op2; hdr[1] = 127; hdr.writeBigUInt64BE(BigInt(len), 2); }
        sock.write(Buffer.concat([hdr, whole]));
      }
    }
  });
  sock.on('error', () => {});
});

srv.listen(port, '127.0.0.1');
