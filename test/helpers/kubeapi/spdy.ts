/**
 * SPDY/3.1 for the stand-in API server, as the kubelet serves it behind the real API server: spdy-transport is
 * the framer (a maintained SPDY implementation; hand-writing one would be the risk). One SPDY stream per channel,
 * named by its `streamType` header: exec (X-Stream-Protocol-Version v4.channel.k8s.io: error, stdin, stdout,
 * stderr, resize; the error stream carries the Status) and port-forward (portforward.k8s.io: an error and a data
 * stream per connection, paired by `requestID`, the data stream piped to the pod's port). The same port-forward
 * serves SPDY tunnelled in a WebSocket (kubectl 1.33's default, websocket.ts unwraps it).
 *
 * Bounds: the streams an exec needs must all arrive within `streamWaitMs` (the kubelet's 30 s
 * "timed out waiting for client to create streams"), else the connection is closed; at most `maxStreams` streams
 * per connection; unpaired port-forward streams are reset after the same wait; resize messages over 4 KiB are
 * refused. spdy-transport insists on HTTP-style `:method`/`:path` in SYN_STREAM, which Kubernetes' spdystream
 * does not send: the parser is given them; and Kubernetes' spdystream has no flow control (it never sends
 * WINDOW_UPDATE: against spdy-transport's 64 KiB window a port-forward stalled at 65536 bytes), so the send
 * windows are opened wide as the kubelet's spdystream leaves them, and TCP's back-pressure is what paces output.
 * Those are the two patches; the types in spdy-transport.d.ts name the state they touch.
 */
import net from 'node:net';
import type { Duplex } from 'node:stream';
import transport, { type SpdyConnection, type SpdyStream } from 'spdy-transport';
import type { Pod } from './api.js';
import { endOutputs, runCommand, type ExecIo } from './exec.js';
import type { Status } from './status.js';

export interface StreamLimits {
  streamWaitMs: number;
  maxStreams: number;
}

export function spdyServer(socket: Duplex, limits: StreamLimits): SpdyConnection {
  const conn = transport.connection.create(socket, { protocol: 'spdy', isServer: true, maxStreams: limits.maxStreams });
  const parser = conn._spdyState.parser;
  const parseKVs = parser.parseKVs.bind(parser);
  parser.parseKVs = (body, cb) =>
    parseKVs(body, (err, headers) => {
      if (!err && headers[':method'] === undefined && headers[':status'] === undefined) Object.assign(headers, { ':method': 'POST', ':path': '/' });
      cb(err, headers);
    });
  const wide = (side: { current: number; max: number; limit: number }) => Object.assign(side, { current: 2 ** 40, max: 2 ** 40, limit: Number.MAX_SAFE_INTEGER });
  wide(conn._spdyState.window.send);
  wide(conn._spdyState.streamWindow.send);
  conn.on('error', () => socket.destroy());
  return conn;
}

const streamType = (s: SpdyStream) => (s.headers.streamtype ?? '').toLowerCase();

/** Reads concatenated {"Width":N,"Height":M} objects from a resize stream. */
function readResizes(stream: SpdyStream, cb: (cols: number, rows: number) => void): void {
  let buf = '';
  stream.on('data', (d: Buffer) => {
    buf += d.toString('utf8');
    if (buf.length > 4096) return stream.destroy();
    let end: number;
    while ((end = buf.indexOf('}')) >= 0) {
      const one = buf.slice(0, end + 1);
      buf = buf.slice(end + 1);
      try {
        const size = JSON.parse(one) as { Width?: number; Height?: number };
        if (size.Width && size.Height) cb(size.Width, size.Height);
      } catch { /* not a size: ignored, as the kubelet logs and goes on */ }
    }
  });
}

export interface SpdyExec {
  command: string[];
  tty: boolean;
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
  cwd: string;
}

/**
 * Answers a stream (SYN_REPLY) and calls `ready` once the reply is queued on the connection, as the kubelet's
 * waitStreamReply: spdy-transport compresses the reply's headers asynchronously, so a reply not waited for can be
 * written after frames queued later (the command's Status, GOAWAY). kubectl creates its streams one by one,
 * each waiting for its reply, and its spdystream stops reading at GOAWAY: a reply behind GOAWAY never arrives,
 * and kubectl hangs in CreateStream, its frame worker blocked on the Status nobody reads yet (the flake this fixed).
 */
function answer(s: SpdyStream, ready: () => void): void {
  s.respond(200, {}, () => ready());
}

/** Exec over SPDY: waits for the streams the options ask for, runs the command, reports on the error stream. */
export function serveSpdyExec(socket: Duplex, o: SpdyExec, limits: StreamLimits): void {
  const conn = spdyServer(socket, limits);
  const want = ['error', ...(o.stdin ? ['stdin'] : []), ...(o.stdout ? ['stdout'] : []), ...(o.stderr && !o.tty ? ['stderr'] : []), ...(o.tty ? ['resize'] : [])];
  const got = new Map<string, SpdyStream>();
  let replied = 0;
  let kill: (() => void) | undefined;
  let closed = false;
  const wait = setTimeout(() => socket.destroy(), limits.streamWaitMs);
  conn.on('close', () => { closed = true; clearTimeout(wait); kill?.(); });
  const start = () => {
    clearTimeout(wait);
    let resize: (cols: number, rows: number) => void = () => undefined;
    const resizeStream = got.get('resize');
    if (resizeStream) readResizes(resizeStream, (c, r) => resize(c, r));
    const stdout = got.get('stdout');
    const stderr = got.get('stderr');
    const io: ExecIo = {
      stdin: got.get('stdin'), stdout, stderr,
      onResize: (cb) => { resize = cb; },
      // The output, then the Status, then GOAWAY (kubectl's spdystream reads nothing after GOAWAY).
      finish: (status: Status) => endOutputs([stdout, stderr], () => got.get('error')!.end(JSON.stringify(status), () => conn.end())),
    };
    kill = runCommand({ command: o.command, tty: o.tty, cwd: o.cwd }, io);
  };
  conn.on('stream', (s) => {
    s.on('error', () => undefined);
    const type = streamType(s);
    if (!want.includes(type) || got.has(type)) {
      s.respond(200, {});
      return s.abort();
    }
    got.set(type, s);
    // Runs once every stream the exec needs has been answered, not merely received.
    answer(s, () => { if (++replied === want.length && !closed) start(); });
  });
}

function forward(pod: Pod, port: number, error: SpdyStream, data: SpdyStream): void {
  const target = pod.ports[port];
  const fail = (why: string) => {
    error.end(`error forwarding port ${port} to pod ${pod.name}, uid uid-${pod.namespace}-${pod.name}: ${why}`);
    data.end();
  };
  if (target === undefined) return fail(`failed to connect to localhost:${port} inside namespace: connect: connection refused`);
  const sock = net.connect(target, '127.0.0.1');
  sock.on('error', (err) => fail(err.message));
  sock.on('connect', () => {
    data.pipe(sock);
    sock.pipe(data);
    sock.on('close', () => error.end());
  });
  data.on('error', () => sock.destroy());
  data.on('close', () => sock.end());
}

/** Port-forward over SPDY (raw or tunnelled): an error and a data stream per forwarded connection. */
export function serveSpdyPortForward(socket: Duplex, pod: Pod, limits: StreamLimits): void {
  const conn = spdyServer(socket, limits);
  const pending = new Map<string, { error?: SpdyStream; data?: SpdyStream; timer: NodeJS.Timeout }>();
  conn.on('close', () => { for (const p of pending.values()) clearTimeout(p.timer); });
  conn.on('stream', (s) => {
    s.respond(200, {});
    s.on('error', () => undefined);
    const type = streamType(s);
    const port = Number(s.headers.port);
    const id = s.headers.requestid ?? '';
    if ((type !== 'error' && type !== 'data') || !Number.isInteger(port) || port < 1 || port > 65535) return s.abort();
    let p = pending.get(id);
    if (!p) {
      if (pending.size >= limits.maxStreams) return s.abort();
      const timer = setTimeout(() => { pending.delete(id); p?.error?.abort(); p?.data?.abort(); }, limits.streamWaitMs);
      p = { timer };
      pending.set(id, p);
    }
    if (p[type]) return s.abort();
    p[type] = s;
    if (p.error && p.data) {
      clearTimeout(p.timer);
      pending.delete(id);
      forward(pod, port, p.error, p.data);
    }
  });
}
