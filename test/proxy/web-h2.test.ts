/**
 * The web port over HTTP/2 and HTTP/1.1 (src/net/http2.ts behind src/proxy/frontdoor.ts), in-process on loopback
 * with real certificates, driven by `openssl s_client`, curl, Node's http2 client and a raw HTTP/2 client that
 * writes frames by hand (the hostile cases: a session that never asks, a body that never ends, a rapid-reset flood,
 * 1000 streams at once, huge headers, a SETTINGS flood).
 *
 * Behind the door: an `api` handler that answers what it saw of the request (protocol, host, client certificate,
 * client address, headers), a path that answers only after a while (the work a rapid reset throws away), and a
 * directory of Web UI files the test writes (the static site itself is tested in test/e2e/web-static.test.ts).
 *
 * No test asserts a timing: a deadline is shown by the counter of the phase that closed the stream or session.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, mkdir, rm, writeFile } from 'node:fs/promises';
import http2 from 'node:http2';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { buildProxyHeaderV1 } from '../../src/mux/proxyproto.js';
import { ConnectionLimits, type LimitSettings, type ListenerStats } from '../../src/net/deadlines.js';
import type { Http2Caps } from '../../src/net/http2.js';
import { clientAddress } from '../../src/stream/meta.js';
import { startFrontDoor, type FrontDoor } from '../../src/proxy/frontdoor.js';
import { PROTOCOLS } from '../../src/proxy/protocols.js';
import { VersionServer } from '../../src/proxy/versions.js';
import { VERSION } from '../../src/version.js';
import { makeTestPki, type ServerCert, type TestPki } from '../helpers/tls.js';
import { curlHead } from '../helpers/curl.js';

setRootLogger(createLogger({ level: 'silent' }));

const HOST = 'proxy.gw.test';
const CLUSTER = 'gw.test';
const BOUND_MS = 15_000;

/** Short HTTP deadlines, so that the hostile cases end within a test; everything else as the defaults. */
const SETTINGS: LimitSettings = {
  tlsHandshakeMs: 2_000,
  headerMs: 600,
  requestMs: 600,
  idleMs: 30_000,
  sshHandshakeMs: 2_000,
  halfCloseLingerMs: 2_000,
  maxConnections: 10_000,
  maxConnectionsPerSource: 10_000,
};

let pki: TestPki;
let cert: ServerCert;
let client: ServerCert;
let webRoot: string;
const cleanups: Array<() => unknown> = [];

interface Door {
  door: FrontDoor;
  port: number;
  limits: ConnectionLimits;
  stats: () => ListenerStats;
}
/** TLS routing with PROXY headers on: the hostile cases run here. */
let one: Door;

beforeAll(async () => {
  pki = await makeTestPki();
  cert = await pki.serverCert({ names: [HOST], ips: ['127.0.0.1'] });
  client = await pki.clientCert({ cn: 'alice' });
  webRoot = await mkdtemp(join(tmpdir(), 'gw-web-h2-'));
  await mkdir(join(webRoot, 'assets'));
  await writeFile(join(webRoot, 'index.html'), '<!doctype html><title>gw</title><div id="app"></div>');
  await writeFile(join(webRoot, 'assets', 'app-abc123.js'), 'console.log("gateway");\n'.repeat(50));
  one = await startDoor('multiplex', { proxyProtocol: true });
});

afterAll(async () => {
  for (const c of cleanups.reverse()) await Promise.resolve(c()).catch(() => undefined);
  await pki?.cleanup();
  if (webRoot) await rm(webRoot, { recursive: true, force: true });
});

async function startDoor(mode: 'multiplex' | 'separate', o: { proxyProtocol?: boolean; caps?: Partial<Http2Caps> } = {}): Promise<Door> {
  const yaml = `gateway:
  nodename: ${HOST}
auth_service:
  cluster_name: ${CLUSTER}
  proxy_listener_mode: ${mode}
proxy_service:
  web_listen_addr: 127.0.0.1:0
  public_addr: ${HOST}:443
  proxy_protocol: ${o.proxyProtocol ? 'on' : 'off'}
`;
  const config = parseConfig(yaml, 'web-h2.test.yaml');
  const limits = new ConnectionLimits(SETTINGS, { openFiles: null, log: createLogger({ level: 'silent' }) });
  const door = await startFrontDoor({
    config,
    clusterName: CLUSTER,
    tls: { key: cert.keyPem, cert: cert.certPem, ca: [pki.caPem] },
    api: apiHandler,
    versions: new VersionServer({ channels: {}, ownVersion: VERSION, dialer: new Dialer({ env: {} }) }),
    limits,
    webRoot,
    // In separate mode only the web listener is bound (the others would take fixed ports).
    ...(mode === 'separate' ? { protocols: PROTOCOLS.filter((row) => row.kind === 'web') } : {}),
    // Lowered so that the caps are reached with few frames; the defaults are HTTP2_CAPS.
    http2Caps: { maxConcurrentStreams: 32, maxRefusedStreams: 50, maxResetsPerSecond: 50, ...o.caps },
  });
  cleanups.push(() => door.close());
  const port = Number(/:(\d+)$/.exec(door.addresses.web!)![1]);
  return { door, port, limits, stats: () => limits.stats().web! };
}

/** What the api saw: the request's protocol, host, certificate and client address, and its header names. */
function apiHandler(req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse): void {
  const path = (req.url ?? '/').split('?')[0]!;
  const answer = () => {
    const socket = req.socket as tls.TLSSocket;
    const peer = socket.getPeerCertificate?.();
    const body = JSON.stringify({
      path,
      httpVersion: req.httpVersion,
      host: req.headers.host,
      authorized: socket.authorized,
      cn: peer?.subject?.CN,
      client: clientAddress(req.socket),
      headerNames: Object.keys(req.headers),
    });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), connection: 'keep-alive' });
    res.end(body);
  };
  if (path === '/v1/slow') {
    const t = setTimeout(() => {
      req.resume();
      answer();
    }, 200);
    res.once('close', () => clearTimeout(t));
    return;
  }
  if (path === '/v1/upload') {
    let bytes = 0;
    req.on('data', (c: Buffer) => (bytes += c.length));
    req.on('end', () => res.end(JSON.stringify({ bytes })));
    return;
  }
  req.resume();
  answer();
}

// --- clients -------------------------------------------------------------------------------------------------------

interface CurlAnswer {
  status: number;
  version: string;
  headers: Record<string, string>;
  body: string;
}

async function curl(port: number, path: string, ...args: string[]): Promise<CurlAnswer> {
  const { status, headers, rest } = await curlHead(
    ['--cacert', pki.caCertPath, '--resolve', `${HOST}:${port}:127.0.0.1`, '-w', '\n%{http_version}', ...args, `https://${HOST}:${port}${path}`],
    { maxBuffer: 16 * 1024 * 1024 },
  );
  const nl = rest.lastIndexOf('\n');
  return { status, version: rest.slice(nl + 1), headers, body: rest.slice(0, nl) };
}

/** Node's HTTP/2 client over a TLS connection (optionally after a PROXY header), with the client certificate. */
async function h2Session(port: number, o: { proxyHeader?: Buffer; cert?: boolean } = {}): Promise<http2.ClientHttp2Session> {
  const raw = net.connect({ host: '127.0.0.1', port });
  await once(raw, 'connect');
  if (o.proxyHeader) raw.write(o.proxyHeader);
  const socket = tls.connect({ socket: raw, servername: HOST, ca: pki.caPem, ALPNProtocols: ['h2'], ...(o.cert ? { cert: client.certPem, key: client.keyPem } : {}) });
  await once(socket, 'secureConnect');
  const session = http2.connect(`https://${HOST}:${port}`, { createConnection: () => socket });
  session.on('error', () => undefined);
  cleanups.push(() => session.destroy());
  return session;
}

async function h2Get(session: http2.ClientHttp2Session, path: string, headers: http2.OutgoingHttpHeaders = {}): Promise<{ status: number; headers: http2.IncomingHttpHeaders; body: string }> {
  const stream = session.request({ ':path': path, ...headers });
  stream.end();
  const [head] = (await once(stream, 'response')) as [http2.IncomingHttpHeaders];
  let body = '';
  stream.setEncoding('utf8');
  for await (const chunk of stream) body += chunk as string;
  return { status: Number(head[':status']), headers: head, body };
}

// --- a raw HTTP/2 client: frames written by hand ---------------------------------------------------------------------

const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');
const enum T {
  DATA = 0,
  HEADERS = 1,
  RST_STREAM = 3,
  SETTINGS = 4,
  PING = 6,
  GOAWAY = 7,
}
const END_STREAM = 0x1;
const END_HEADERS = 0x4;
const ACK = 0x1;

function frame(type: number, flags: number, stream: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(9);
  head.writeUIntBE(payload.length, 0, 3);
  head[3] = type;
  head[4] = flags;
  head.writeUInt32BE(stream, 5);
  return Buffer.concat([head, payload]);
}

/** An HPACK integer with an n-bit prefix (RFC 7541 section 5.1). */
function hpackInt(value: number, bits: number, flags = 0): Buffer {
  const max = (1 << bits) - 1;
  if (value < max) return Buffer.from([flags | value]);
  const out = [flags | max];
  for (value -= max; value >= 128; value >>= 7) out.push((value & 0x7f) | 0x80);
  out.push(value);
  return Buffer.from(out);
}

const hpackString = (s: string): Buffer => Buffer.concat([hpackInt(Buffer.byteLength(s), 7), Buffer.from(s)]);
/** A literal header field without indexing, with a literal name. */
const literal = (name: string, value: string): Buffer => Buffer.concat([Buffer.from([0]), hpackString(name), hpackString(value)]);

function requestHeaders(stream: number, method: string, path: string, o: { endStream?: boolean; extra?: Array<[string, string]> } = {}): Buffer {
  const block = Buffer.concat([literal(':method', method), literal(':scheme', 'https'), literal(':path', path), literal(':authority', HOST), ...(o.extra ?? []).map(([n, v]) => literal(n, v))]);
  return frame(T.HEADERS, END_HEADERS | (o.endStream === false ? 0 : END_STREAM), stream, block);
}

const rstStream = (stream: number, code = http2.constants.NGHTTP2_CANCEL): Buffer => {
  const p = Buffer.alloc(4);
  p.writeUInt32BE(code);
  return frame(T.RST_STREAM, 0, stream, p);
};

interface Frame {
  type: number;
  flags: number;
  stream: number;
  payload: Buffer;
}

/** A TLS connection (ALPN h2) that speaks HTTP/2 frame by frame and records every frame the server sends. */
class RawH2 {
  readonly frames: Frame[] = [];
  private buffered = Buffer.alloc(0);
  readonly closed: Promise<void>;
  private waiters: Array<() => void> = [];

  private constructor(readonly socket: tls.TLSSocket) {
    socket.on('data', (c: Buffer) => this.onData(c));
    socket.on('error', () => undefined);
    this.closed = new Promise((resolve) => socket.once('close', () => resolve()));
    cleanups.push(() => socket.destroy());
  }

  static async open(port: number, o: { settings?: boolean } = {}): Promise<RawH2> {
    const socket = tls.connect({ host: '127.0.0.1', port, servername: HOST, ca: pki.caPem, ALPNProtocols: ['h2'] });
    await once(socket, 'secureConnect');
    expect(socket.alpnProtocol).toBe('h2');
    const c = new RawH2(socket);
    if (o.settings !== false) c.send(PREFACE, frame(T.SETTINGS, 0, 0));
    return c;
  }

  send(...bufs: Buffer[]): void {
    if (!this.socket.destroyed) this.socket.write(Buffer.concat(bufs));
  }

  get goaway(): { lastStream: number; code: number } | undefined {
    const f = this.frames.find((x) => x.type === T.GOAWAY);
    return f ? { lastStream: f.payload.readUInt32BE(0) & 0x7fffffff, code: f.payload.readUInt32BE(4) } : undefined;
  }

  resetsOf(code: number): number[] {
    return this.frames.filter((f) => f.type === T.RST_STREAM && f.payload.readUInt32BE(0) === code).map((f) => f.stream);
  }

  /** Resolves once a frame matching pred has come (or the connection closed: then false). */
  async until(pred: (f: Frame) => boolean): Promise<boolean> {
    for (;;) {
      if (this.frames.some(pred)) return true;
      if (this.socket.destroyed) return false;
      await Promise.race([new Promise<void>((r) => this.waiters.push(r)), this.closed]);
    }
  }

  private onData(c: Buffer): void {
    this.buffered = Buffer.concat([this.buffered, c]);
    while (this.buffered.length >= 9) {
      const len = this.buffered.readUIntBE(0, 3);
      if (this.buffered.length < 9 + len) break;
      this.frames.push({ type: this.buffered[3]!, flags: this.buffered[4]!, stream: this.buffered.readUInt32BE(5) & 0x7fffffff, payload: this.buffered.subarray(9, 9 + len) });
      this.buffered = this.buffered.subarray(9 + len);
    }
    for (const w of this.waiters.splice(0)) w();
  }

  /** Acknowledges the server's SETTINGS, as every client must: only then do they apply (the header list cap). */
  async acknowledgeSettings(): Promise<void> {
    await this.until((f) => f.type === T.SETTINGS && (f.flags & ACK) === 0);
    this.send(frame(T.SETTINGS, ACK, 0));
    await this.until((f) => f.type === T.SETTINGS && (f.flags & ACK) !== 0);
  }
}

const statusOf = (f: Frame): boolean => f.type === T.HEADERS;

// --- tests ---------------------------------------------------------------------------------------------------------

describe('ALPN on the web port', () => {
  it('openssl s_client -alpn h2 gets h2 (the issue\'s own check); -alpn http/1.1 gets http/1.1', async () => {
    for (const alpn of ['h2', 'http/1.1']) {
      const out = await new Promise<string>((resolve, reject) => {
        const child = spawn('openssl', ['s_client', '-connect', `127.0.0.1:${one.port}`, '-alpn', alpn, '-servername', HOST, '-CAfile', pki.caCertPath, '-verify_return_error'], { stdio: ['pipe', 'pipe', 'pipe'] });
        let text = '';
        child.stdout.on('data', (c: Buffer) => (text += c.toString()));
        child.once('error', reject);
        child.once('close', () => resolve(text));
        child.stdin.end();
      });
      expect(out).toContain(`ALPN protocol: ${alpn}`);
      expect(out).toContain('Verify return code: 0 (ok)');
    }
  });

  it('curl --http2 and --http1.1 both reach ping, the api and a static file', async () => {
    for (const [flag, version] of [['--http2', '2'], ['--http1.1', '1.1']] as const) {
      const ping = await curl(one.port, '/webapi/ping', flag);
      expect(ping.status).toBe(200);
      expect(ping.version).toBe(version);
      expect(JSON.parse(ping.body).proxy.tls_routing_enabled).toBe(true);
      const api = await curl(one.port, '/v1/anything', flag);
      expect(JSON.parse(api.body)).toMatchObject({ path: '/v1/anything', httpVersion: version === '2' ? '2.0' : '1.1', host: `${HOST}:${one.port}` });
      const file = await curl(one.port, '/web/assets/app-abc123.js', flag);
      expect(file.status).toBe(200);
      expect(file.headers['cache-control']).toBe('public, max-age=31536000, immutable');
      expect(file.body).toContain('console.log("gateway")');
    }
  });

  it('curl --no-alpn speaks HTTP/1.1', async () => {
    const ping = await curl(one.port, '/webapi/ping', '--no-alpn');
    expect(ping.status).toBe(200);
    expect(ping.version).toBe('1.1');
  });

  it('over h2 the api sees the client certificate, the PROXY header\'s address, a host, and no pseudo-header is lost', async () => {
    const header = buildProxyHeaderV1({ family: 'tcp4', source: { address: '203.0.113.9', port: 41000 }, destination: { address: '127.0.0.1', port: one.port } });
    const session = await h2Session(one.port, { proxyHeader: header, cert: true });
    const a = await h2Get(session, '/v1/who');
    expect(a.status).toBe(200);
    const seen = JSON.parse(a.body);
    expect(seen).toMatchObject({ httpVersion: '2.0', authorized: true, cn: 'alice', client: { address: '203.0.113.9', port: 41000 } });
    expect(seen.host).toBe(`${HOST}:${one.port}`);
    // Connection-specific headers of an answer (connection: keep-alive above) are dropped on h2, not an error.
    expect(a.headers.connection).toBeUndefined();
    // A second request on the same session sees the same.
    expect(JSON.parse((await h2Get(session, '/v1/again')).body)).toMatchObject({ cn: 'alice', client: { address: '203.0.113.9' } });
    session.close();
    await once(session, 'close');
    await expect.poll(() => one.stats().open, { timeout: BOUND_MS }).toBe(0);
  });
});

describe('hostile HTTP/2 clients', () => {
  it('a session that sends no request is closed at header_timeout (GOAWAY), counted as http-headers', async () => {
    const before = one.stats().deadlines['http-headers'] ?? 0;
    const c = await RawH2.open(one.port);
    await c.closed;
    expect(c.goaway).toMatchObject({ code: http2.constants.NGHTTP2_NO_ERROR });
    expect(one.stats().deadlines['http-headers']).toBe(before + 1);
  }, BOUND_MS);

  it('TLS with ALPN h2 and then not even the preface: closed, counted', async () => {
    const before = one.stats().deadlines['http-headers'] ?? 0;
    const c = await RawH2.open(one.port, { settings: false });
    await c.closed;
    expect(one.stats().deadlines['http-headers']).toBe(before + 1);
  }, BOUND_MS);

  it('a request whose body never ends is reset at request_timeout; the session goes on serving', async () => {
    const before = one.stats().deadlines['http-request'] ?? 0;
    const c = await RawH2.open(one.port);
    c.send(requestHeaders(1, 'POST', '/v1/upload', { endStream: false }), frame(T.DATA, 0, 1, Buffer.from('a few bytes, then nothing')));
    expect(await c.until((f) => f.type === T.RST_STREAM && f.stream === 1)).toBe(true);
    expect(c.resetsOf(http2.constants.NGHTTP2_CANCEL)).toEqual([1]);
    expect(one.stats().deadlines['http-request']).toBe(before + 1);
    c.send(requestHeaders(3, 'GET', '/v1/after'));
    expect(await c.until((f) => statusOf(f) && f.stream === 3)).toBe(true);
    c.socket.destroy();
  }, BOUND_MS);

  it('a rapid-reset flood (HEADERS then RST_STREAM, over and over) closes the session with ENHANCE_YOUR_CALM', async () => {
    const before = one.stats().closed['h2-rapid-reset'] ?? 0;
    const c = await RawH2.open(one.port);
    const burst: Buffer[] = [];
    for (let id = 1; id < 2 * 400; id += 2) burst.push(requestHeaders(id, 'GET', '/v1/slow'), rstStream(id));
    c.send(...burst);
    await c.closed;
    expect(c.goaway?.code).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
    expect(one.stats().closed['h2-rapid-reset']).toBe(before + 1);
    // Meanwhile and after, others are served.
    expect((await curl(one.port, '/webapi/ping', '--http2')).status).toBe(200);
  }, BOUND_MS);

  it('a client that leaves with many requests in flight is no rapid reset', async () => {
    const d = await startDoor('multiplex', { caps: { maxResetsPerSecond: 10 } });
    const c = await RawH2.open(d.port);
    await c.acknowledgeSettings();
    c.send(...Array.from({ length: 30 }, (_, i) => requestHeaders(2 * i + 1, 'POST', '/v1/upload', { endStream: false })));
    await expect.poll(() => d.door.limits.stats().web!.open).toBe(1);
    // Let the streams open on the server (each answers nothing until its body ends), then leave.
    c.send(requestHeaders(61, 'GET', '/v1/marker'));
    await c.until((f) => statusOf(f) && f.stream === 61);
    c.socket.destroy();
    await expect.poll(() => d.stats().open, { timeout: BOUND_MS }).toBe(0);
    expect(d.stats().closed).toEqual({});
  }, BOUND_MS);

  it('1000 streams at once: those over the concurrent cap are refused, then the session is closed; others are served', async () => {
    const before = one.stats().closed;
    const c = await RawH2.open(one.port);
    const burst: Buffer[] = [];
    for (let id = 1; id < 2 * 1000; id += 2) burst.push(requestHeaders(id, 'POST', '/v1/upload', { endStream: false }));
    c.send(...burst);
    await c.closed;
    expect(c.resetsOf(http2.constants.NGHTTP2_REFUSED_STREAM).length).toBeGreaterThan(0);
    const after = one.stats().closed;
    const delta = Object.fromEntries(Object.entries(after).map(([k, v]) => [k, v! - (before[k as keyof typeof before] ?? 0)]).filter(([, v]) => v !== 0));
    // nghttp2 takes a stream over SETTINGS_MAX_CONCURRENT_STREAMS for an invalid frame: Node's cap on those closes.
    expect(delta).toEqual({ 'h2-invalid-frames': 1 });
    expect((await curl(one.port, '/webapi/ping', '--http2')).status).toBe(200);

    // A client that acknowledged the cap and still exceeds it breaks the protocol: the session is closed at once.
    const before2 = one.stats().closed['h2-protocol'] ?? 0;
    const acked = await RawH2.open(one.port);
    await acked.acknowledgeSettings();
    acked.send(...burst.slice(0, 300));
    await acked.closed;
    expect(one.stats().closed['h2-protocol']).toBe(before2 + 1);
  }, BOUND_MS);

  it('huge headers: a header list over the cap is refused (the stream, or 431 on HTTP/1.1); the server goes on', async () => {
    const big = 'x'.repeat(40_000);
    const c = await RawH2.open(one.port);
    await c.acknowledgeSettings();
    // HEADERS of 40 KB: over SETTINGS_MAX_FRAME_SIZE, so sent as HEADERS + CONTINUATION the way a client must.
    const block = Buffer.concat([literal(':method', 'GET'), literal(':scheme', 'https'), literal(':path', '/v1/big'), literal(':authority', HOST), literal('x-big', big)]);
    const parts: Buffer[] = [];
    for (let off = 0; off < block.length; off += 16_384) parts.push(block.subarray(off, off + 16_384));
    c.send(frame(T.HEADERS, END_STREAM | (parts.length === 1 ? END_HEADERS : 0), 1, parts[0]!), ...parts.slice(1).map((p, i) => frame(9, i === parts.length - 2 ? END_HEADERS : 0, 1, p)));
    expect(await c.until((f) => (f.type === T.RST_STREAM && f.stream === 1) || f.type === T.GOAWAY)).toBe(true);
    expect(c.frames.some((f) => statusOf(f) && f.stream === 1)).toBe(false);
    c.socket.destroy();
    // HTTP/1.1: 431, or the connection reset when the server closes it while curl still sends the head.
    const h1 = await curl(one.port, '/v1/big', '--http1.1', '-H', `x-big: ${big}`).then((a) => a.status, () => 'reset');
    expect([431, 'reset']).toContain(h1);
    const ok = await curl(one.port, '/v1/small', '--http2', '-H', `x-small: ${'y'.repeat(1000)}`);
    expect(ok.status).toBe(200);
  }, BOUND_MS);

  it('a SETTINGS flood whose acknowledgements are never read closes the session, counted as h2-flood', async () => {
    const before = one.stats().closed['h2-flood'] ?? 0;
    const c = await RawH2.open(one.port);
    c.socket.pause(); // never read the ACKs
    const settings = frame(T.SETTINGS, 0, 0);
    const chunk = Buffer.concat(Array.from({ length: 10_000 }, () => settings));
    for (let i = 0; i < 20 && !c.socket.destroyed; i++) {
      c.socket.write(chunk);
      await new Promise((r) => setTimeout(r, 10));
    }
    c.socket.resume();
    await c.closed;
    expect(one.stats().closed['h2-flood']).toBe(before + 1);
  }, BOUND_MS);

  it('a SETTINGS frame of more entries than the cap, and a PING flood, close their sessions', async () => {
    const big = await RawH2.open(one.port, { settings: false });
    const entries = Buffer.concat(Array.from({ length: 40 }, (_, i) => Buffer.from([0, 1, 0, 0, 0x10, i])));
    big.send(PREFACE, frame(T.SETTINGS, 0, 0, entries));
    await big.closed;
    // nghttp2 ends that session itself (GOAWAY, no ACK) and reads nothing more; the socket goes at the next deadline.
    expect(big.goaway?.code).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
    expect(big.frames.some((f) => f.type === T.SETTINGS && (f.flags & ACK) !== 0)).toBe(false);

    const before = one.stats().closed['h2-flood'] ?? 0;
    const pings = await RawH2.open(one.port);
    pings.socket.pause();
    const ping = frame(T.PING, 0, 0, Buffer.alloc(8));
    const chunk = Buffer.concat(Array.from({ length: 10_000 }, () => ping));
    for (let i = 0; i < 20 && !pings.socket.destroyed; i++) {
      pings.socket.write(chunk);
      await new Promise((r) => setTimeout(r, 10));
    }
    pings.socket.resume();
    await pings.closed;
    // Far fewer answers than PINGs sent: the session was closed early in the flood.
    expect(pings.frames.filter((f) => f.type === T.PING).length).toBeLessThan(1000);
    expect(one.stats().closed['h2-flood']).toBe(before + 1);
  }, BOUND_MS);

  it('a CONTINUATION flood (one header block spread over thousands of frames) closes the session at once', async () => {
    const before = one.stats().closed['h2-protocol'] ?? 0;
    const c = await RawH2.open(one.port);
    await c.acknowledgeSettings();
    const block = Buffer.concat([literal(':method', 'GET'), literal(':scheme', 'https'), literal(':path', '/v1/cont'), literal(':authority', HOST)]);
    const continuations = Array.from({ length: 5000 }, (_, i) => frame(9, 0, 1, literal(`x-h${i}`, 'v')));
    c.send(frame(T.HEADERS, END_STREAM, 1, block), ...continuations);
    await c.closed;
    expect(c.goaway).toBeDefined();
    expect(c.frames.some((f) => statusOf(f) && f.stream === 1)).toBe(false);
    expect(one.stats().closed['h2-protocol']).toBe(before + 1);
  }, BOUND_MS);

  it('after all of it, every connection is gone from the listener', async () => {
    await expect.poll(() => one.stats().open, { timeout: BOUND_MS }).toBe(0);
  }, BOUND_MS);
});

describe('separate listeners', () => {
  it('web_listen_addr alone negotiates h2 and http/1.1 and serves ping and the Web UI', async () => {
    const d = await startDoor('separate');
    for (const [flag, version] of [['--http2', '2'], ['--http1.1', '1.1']] as const) {
      const ping = await curl(d.port, '/webapi/ping', flag);
      expect(ping.version).toBe(version);
      expect(JSON.parse(ping.body).proxy.tls_routing_enabled).toBe(false);
      const page = await curl(d.port, '/web/', flag);
      expect(page.status).toBe(200);
      expect(page.headers['cache-control']).toBe('no-store');
    }
    const c = await RawH2.open(d.port);
    await c.closed;
    expect(d.stats().deadlines['http-headers']).toBe(1);
  }, BOUND_MS);
});
