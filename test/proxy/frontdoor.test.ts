/**
 * The Proxy's front door (src/proxy/frontdoor.ts) started in-process on loopback with real certificates, and
 * driven with real sockets: Node tls clients, `openssl s_client`, curl, a `ws` WebSocket client and raw TCP
 * sockets that send hostile bytes.
 *
 * Behind the door: a tiny `api` handler (stands for the auth router), a real VersionServer, and an echo service
 * per route kind (resource, tunnel, kube get the TLS socket after the handshake, ssh and the raw tunnel
 * listener the raw stream; each echoes bytes back). Every service records what it was handed (its kind,
 * ConnInfo, negotiated ALPN, client address), so tests can check the routing decision, not only that bytes came
 * back.
 *
 * The main door runs with TLS routing (multiplex), proxy_protocol on and detect_timeout 1s. The 10 000 idle
 * connections, HAProxy and curl-through-squid scenarios run against the real daemon in test/e2e/.
 *
 * No test asserts a timing: "closed quickly" is checked through the reason the multiplexer counted (a refusal for
 * what was sent, not the detect deadline).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { EventEmitter, once } from 'node:events';
import https from 'node:https';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket, { createWebSocketStream } from 'ws';
import { parseConfig, type GatewayConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { isGatewayError, type GatewayError } from '../../src/errors.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { pino } from 'pino';
import { clientAddress } from '../../src/stream/meta.js';
import { parseClientHello } from '../../src/mux/clienthello.js';
import type { ConnInfo, MultiplexerStats } from '../../src/mux/multiplexer.js';
import { buildProxyHeaderV1, buildProxyHeaderV2 } from '../../src/mux/proxyproto.js';
import { startFrontDoor, type FrontDoor, type FrontDoorOptions, type ServiceHandler } from '../../src/proxy/frontdoor.js';
import { VersionServer } from '../../src/proxy/versions.js';
import { VERSION } from '../../src/version.js';
import { makeTestPki, type ServerCert, type TestPki } from '../helpers/tls.js';
import { separateListenKeys } from '../helpers/listeners.js';
import { listenerRows, WIRE_PROTOCOLS } from '../../src/wire/protocols.js';
import { UPGRADE_MAX_PAYLOAD, UPGRADE_PATH, UPGRADE_TRANSPORT } from '../../src/wire/ping.js';
import { curlHead } from '../helpers/curl.js';

setRootLogger(createLogger({ level: 'silent' }));


const HOST = 'proxy.gw.test';
const KUBE_SNI = `kube-gateway-proxy-alpn.${HOST}`;
const CLUSTER = 'gw.test';
/** The ALPN protocols routed besides the web's (ARCHITECTURE.md, wire identifiers), and the kind of service behind each. */
const ALPN_ROUTES = {
  'gateway-reversetunnel': 'tunnel',
  'gateway-proxy-ssh': 'resource',
  'gateway-postgres': 'resource',
  'gateway-mysql': 'resource',
  'gateway-mongodb': 'resource',
  'gateway-redis': 'resource',
  'gateway-tcp': 'resource',
} as const;
/** Protocols that take a "-ping" suffix (ARCHITECTURE.md, wire identifiers). */
const PING_CAPABLE = ['gateway-postgres', 'gateway-mysql', 'gateway-mongodb', 'gateway-redis', 'gateway-tcp'] as const;
const VERSION_PREFIX = '/v1/webapi/automaticupgrades/channel';

let pki: TestPki;
let cert: ServerCert;
/** The main door: multiplex, proxy_protocol on, detect_timeout 1s. */
let door: FrontDoor;
let port: number;
const cleanups: Array<() => unknown> = [];

beforeAll(async () => {
  pki = await makeTestPki();
  cert = await pki.serverCert({ names: [HOST, KUBE_SNI], ips: ['127.0.0.1'] });
  door = await startDoor(MULTIPLEX_YAML);
  port = portOf(door.addresses.web!);
});

afterAll(async () => {
  for (const c of cleanups.reverse()) await Promise.resolve(c()).catch(() => undefined);
  await pki?.cleanup();
});

// --- configuration and the door ----------------------------------------------------------------------------------

const CHANNELS_YAML = `  automatic_upgrades_channels:
    stable/v14: {static_version: v14.3.7}
`;

const MULTIPLEX_YAML = `gateway:
  nodename: ${HOST}
auth_service:
  cluster_name: ${CLUSTER}
  proxy_listener_mode: multiplex
proxy_service:
  web_listen_addr: 127.0.0.1:0
  public_addr: ${HOST}:443
  proxy_protocol: on
  detect_timeout: 1s
${CHANNELS_YAML}`;

function separateYaml(overrides: Record<string, string> = {}): string {
  const addrs: Record<string, string> = {
    web_listen_addr: '127.0.0.1:0',
    ...Object.fromEntries(separateListenKeys({ optional: true }).map((key) => [key, '127.0.0.1:0'])),
    ...overrides,
  };
  return `gateway:
  nodename: ${HOST}
auth_service:
  cluster_name: ${CLUSTER}
  proxy_listener_mode: separate
proxy_service:
  public_addr: ${HOST}:443
  detect_timeout: 1s
${Object.entries(addrs).map(([k, v]) => `  ${k}: ${v}`).join('\n')}
${CHANNELS_YAML}`;
}

const config = (yaml: string): GatewayConfig => parseConfig(yaml, 'frontdoor.test.yaml');

/** What a service was handed. */
interface Seen {
  /** The route's name (ConnInfo.route). */
  service: string;
  /** Which service got it (ProtocolServices key). */
  kind: string;
  info: ConnInfo;
  /** The ALPN protocol the service's TLS socket negotiated (false: none); undefined for raw services. */
  alpn?: string | false | null;
  /** What clientAddress() says for the stream the service got (PROXY header address when there was one). */
  client: { address: string; port: number };
}

const seen: Seen[] = [];
const seenEvents = new EventEmitter();

function record(s: Seen): void {
  seen.push(s);
  seenEvents.emit('seen', s);
}

/** The first record matching `pred`, now or when it arrives. */
function waitSeen(pred: (s: Seen) => boolean): Promise<Seen> {
  const hit = seen.find(pred);
  if (hit) return Promise.resolve(hit);
  return new Promise((resolve) => {
    const on = (s: Seen) => {
      if (!pred(s)) return;
      seenEvents.off('seen', on);
      resolve(s);
    };
    seenEvents.on('seen', on);
  });
}

/** The record of the connection whose client side is `local` (the service sees it as its remote end). */
// By both ends: the same client port may serve connections to different listeners one after the other.
const seenFor = (local: { localPort?: number | undefined; remotePort?: number | undefined }) =>
  waitSeen((s) => s.info.remotePort === local.localPort && s.info.remoteAddress === '127.0.0.1' && (local.remotePort === undefined || s.info.localPort === local.remotePort));

/** Echoes what it gets; a TLS socket's negotiated ALPN is recorded (a raw socket has none: undefined). */
function echo(kind: string): ServiceHandler {
  return (stream, info) => {
    const socket = stream as tls.TLSSocket;
    record({ service: info.route, kind, info, alpn: socket.alpnProtocol, client: clientAddress(socket) });
    stream.on('error', () => undefined);
    stream.pipe(stream);
  };
}

async function startDoor(yaml: string, extra: Partial<FrontDoorOptions> = {}): Promise<FrontDoor> {
  const cfg = config(yaml);
  const versions = new VersionServer({
    channels: cfg.proxy_service.automatic_upgrades_channels,
    ownVersion: VERSION,
    dialer: new Dialer({ env: {} }),
  });
  const d = await startFrontDoor({
    config: cfg,
    clusterName: CLUSTER,
    tls: { key: cert.keyPem, cert: cert.certPem, ca: [pki.caPem] },
    api: (req, res) => {
      req.resume();
      const body = JSON.stringify({ ok: true });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    },
    versions,
    services: { resource: echo('resource'), tunnel: echo('tunnel'), kube: echo('kube'), ssh: echo('ssh') },
    upgradePingIntervalMs: 100,
    ...extra,
  });
  cleanups.push(() => d.close());
  return d;
}

const portOf = (addr: string): number => Number(/:(\d+)$/.exec(addr)![1]);

// --- clients -----------------------------------------------------------------------------------------------------

/** Destroyed in afterAll whatever a test did with them. */
function track<T extends { destroy(): unknown }>(s: T): T {
  cleanups.push(() => s.destroy());
  return s;
}

interface TlsClientOptions {
  port?: number;
  alpn?: string[];
  servername?: string;
  /** An already connected stream to run TLS over (PROXY header sent first, WebSocket stream). */
  socket?: Duplex;
}

/** A TLS client that trusts the test CA; resolves once the handshake is done, rejects on its error. */
function connectTls(o: TlsClientOptions = {}): Promise<tls.TLSSocket> {
  return new Promise((resolve, reject) => {
    const s = track(
      tls.connect({
        ...(o.socket ? { socket: o.socket } : { host: '127.0.0.1', port: o.port ?? port }),
        servername: o.servername ?? HOST,
        ca: pki.caPem,
        ...(o.alpn ? { ALPNProtocols: o.alpn } : {}),
      }),
    );
    s.once('secureConnect', () => {
      s.off('error', reject);
      s.on('error', () => undefined);
      resolve(s);
    });
    s.once('error', reject);
  });
}

/** The error a handshake fails with (the test fails when it succeeds). */
async function handshakeError(o: TlsClientOptions): Promise<NodeJS.ErrnoException> {
  try {
    const s = await connectTls(o);
    s.destroy();
  } catch (err) {
    return err as NodeJS.ErrnoException;
  }
  throw new Error(`the handshake offering ${JSON.stringify(o.alpn)} succeeded`);
}

/** Writes `payload` and resolves with the first payload.length bytes that come back. */
async function roundTrip(s: Duplex, payload: Buffer | string): Promise<Buffer> {
  const want = Buffer.from(payload);
  const chunks: Buffer[] = [];
  let got = 0;
  const done = new Promise<Buffer>((resolve, reject) => {
    const onData = (c: Buffer) => {
      chunks.push(c);
      got += c.length;
      if (got < want.length) return;
      s.off('data', onData);
      s.off('close', onClose);
      resolve(Buffer.concat(chunks).subarray(0, want.length));
    };
    const onClose = () => reject(new Error(`closed after ${got} of ${want.length} echoed bytes`));
    s.on('data', onData);
    s.once('close', onClose);
  });
  s.write(want);
  return done;
}

/** A plain TCP connection to the door (or another port). */
async function connectRaw(p = port): Promise<net.Socket> {
  const s = track(net.connect({ host: '127.0.0.1', port: p }));
  s.on('error', () => undefined);
  await once(s, 'connect');
  return s;
}

/** A WebSocket client to the door; its TLS offers no ALPN, so it reaches the web server. Trusts the test CA. */
function wsClient(path: string, protocols: string[]): WebSocket {
  // servername is a tls.connect option that ws passes through; ws's ClientOptions type does not list it.
  const options: WebSocket.ClientOptions & Pick<tls.ConnectionOptions, 'servername'> = { ca: pki.caPem, servername: HOST };
  const ws = new WebSocket(`wss://127.0.0.1:${port}${path}`, protocols, options);
  cleanups.push(() => ws.terminate());
  return ws;
}

/**
 * Resolves when the socket has closed (by the peer or locally); errors such as ECONNRESET count as closed. What
 * the peer sent (an alert, a redirect) is drained, or the end of the stream would never be seen.
 */
function closed(s: net.Socket): Promise<void> {
  s.on('error', () => undefined);
  if (s.readableFlowing !== true) s.resume();
  if (s.closed) return Promise.resolve();
  return new Promise((resolve) => s.once('close', () => resolve()));
}

/** A raw connection that sends `prefix` first, then runs TLS with `alpn` over it. */
async function tlsAfter(prefix: Buffer, alpn: string, p = port): Promise<tls.TLSSocket> {
  const raw = await connectRaw(p);
  raw.write(prefix);
  return connectTls({ socket: raw, alpn: [alpn] });
}

/** Opens a WebSocket to the door (no ALPN on the outer TLS, so it reaches the web server). */
function openUpgrade(protocols: string[]): Promise<WebSocket> {
  const ws = wsClient(UPGRADE_PATH, protocols);
  return new Promise((resolve, reject) => {
    ws.once('open', () => resolve(ws));
    ws.once('error', reject);
  });
}

/** An upgrade the proxy must refuse: its HTTP status and body. */
function refusedUpgrade(path: string, protocols: string[]): Promise<{ status: number; body: string }> {
  const ws = wsClient(path, protocols);
  return new Promise((resolve, reject) => {
    ws.once('open', () => {
      ws.terminate();
      reject(new Error(`the upgrade offering ${JSON.stringify(protocols)} was accepted`));
    });
    ws.once('error', reject);
    ws.once('unexpected-response', (req, res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => {
        req.destroy();
        resolve({ status: res.statusCode ?? 0, body });
      });
    });
  });
}

/** Writes `bytes` one byte every 200 ms until the socket closes. */
function trickle(s: net.Socket, bytes: Buffer): void {
  let i = 0;
  const timer = setInterval(() => {
    if (s.destroyed || i >= bytes.length) return clearInterval(timer);
    s.write(bytes.subarray(i, ++i));
  }, 200);
  s.once('close', () => clearInterval(timer));
  cleanups.push(() => clearInterval(timer));
}

interface HttpAnswer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** GET over TLS to the door with Node's https client (no agent, so no ALPN unless asked for). */
function httpsGet(path: string, o: { port?: number; alpn?: string[] } = {}): Promise<HttpAnswer> {
  const p = o.port ?? port;
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: '127.0.0.1',
        port: p,
        path,
        servername: HOST,
        ca: pki.caPem,
        agent: false,
        headers: { host: `${HOST}:${p}` },
        ...(o.alpn ? { ALPNProtocols: o.alpn } : {}),
      },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (body += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end();
  });
}

interface CurlAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** curl -i to https://proxy.gw.test:PORT<path>, the name resolved to 127.0.0.1, trusting the test CA. */
async function curl(path: string, ...args: string[]): Promise<CurlAnswer> {
  const { status, headers, rest } = await curlHead(['--cacert', pki.caCertPath, '--resolve', `${HOST}:${port}:127.0.0.1`, ...args, `https://${HOST}:${port}${path}`]);
  return { status, headers, body: rest };
}

/**
 * `openssl s_client -alpn <alpn> -servername proxy.gw.test` against the door: sends `line` on standard input,
 * closes standard input once the line came back (or s_client gave up) and resolves with everything it printed.
 * The line must not start with a letter s_client takes as a command (Q, R, k, K).
 */
async function opensslEcho(alpn: string, line: string): Promise<string> {
  const child: ChildProcess = spawn(
    'openssl',
    ['s_client', '-connect', `127.0.0.1:${port}`, '-alpn', alpn, '-servername', HOST, '-CAfile', pki.caCertPath, '-verify_return_error', '-verify_hostname', HOST],
    { stdio: ['pipe', 'pipe', 'pipe'] },
  );
  cleanups.push(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  let out = '';
  const exited = once(child, 'close');
  await new Promise<void>((resolve) => {
    child.stdout!.setEncoding('utf8');
    child.stdout!.on('data', (c: string) => {
      out += c;
      if (out.includes(`${line}\n`)) resolve();
    });
    child.once('close', () => resolve());
    child.stdin!.write(`${line}\n`);
  });
  child.stdin!.end();
  await exited;
  return out;
}

// --- hand-made ClientHellos ----------------------------------------------------------------------------------------

const u8 = (n: number) => Buffer.from([n]);
const u16 = (n: number) => Buffer.from([n >> 8, n & 0xff]);
const u24 = (n: number) => Buffer.from([(n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff]);
const ext = (type: number, data: Buffer) => Buffer.concat([u16(type), u16(data.length), data]);

/** A TLS 1.3-style ClientHello (one cipher suite), split into records of at most 2^14 bytes. */
function clientHello(o: { serverName?: string; alpn?: string[] } = {}): Buffer {
  const exts: Buffer[] = [];
  if (o.serverName !== undefined) {
    const name = Buffer.from(o.serverName, 'latin1');
    const list = Buffer.concat([u8(0), u16(name.length), name]);
    exts.push(ext(0, Buffer.concat([u16(list.length), list])));
  }
  if (o.alpn !== undefined) {
    const list = Buffer.concat(o.alpn.map((a) => Buffer.concat([u8(a.length), Buffer.from(a, 'latin1')])));
    exts.push(ext(16, Buffer.concat([u16(list.length), list])));
  }
  exts.push(ext(43, Buffer.concat([u8(2), u16(0x0304)])));
  const block = Buffer.concat(exts);
  const body = Buffer.concat([u16(0x0303), randomBytes(32), u8(0), u16(2), u16(0x1301), u8(1), u8(0), u16(block.length), block]);
  const message = Buffer.concat([u8(1), u24(body.length), body]);
  const records: Buffer[] = [];
  for (let off = 0; off < message.length; off += 16384) {
    const fragment = message.subarray(off, off + 16384);
    records.push(Buffer.concat([u8(22), u16(0x0301), u16(fragment.length), fragment]));
  }
  return Buffer.concat(records);
}

/**
 * The largest host_name the ClientHello length fields can carry (~64 KiB: the extensions block, the extension and
 * the name all have 16-bit lengths), made of valid 63-byte labels.
 */
function hugeServerName(): string {
  const max = 0xffff - 4 /* extension header */ - 2 - 1 - 2 /* list length, name type, name length */ - 4 /* supported_versions */ - 3;
  const labels: string[] = [];
  let length = -1;
  while (length + 64 <= max) {
    labels.push('a'.repeat(63));
    length += 64;
  }
  return labels.join('.');
}

const refusedDelta = (before: MultiplexerStats, after: MultiplexerStats): Record<string, number> =>
  Object.fromEntries(
    Object.entries(after.refused)
      .map(([reason, n]) => [reason, n - (before.refused[reason] ?? 0)] as const)
      .filter(([, n]) => n > 0),
  );

// =================================================================================================================

describe('ALPN routes (TLS routing on the web port)', () => {
  it.each(Object.entries(ALPN_ROUTES))('%s: negotiated exactly as offered, bytes echo through its %s service', async (route, kind) => {
    const s = await connectTls({ alpn: [route] });
    expect(s.alpnProtocol).toBe(route);
    expect(s.authorized).toBe(true);
    const payload = randomBytes(64 * 1024);
    expect((await roundTrip(s, payload)).equals(payload)).toBe(true);
    const got = await seenFor(s);
    expect(got.service).toBe(route);
    expect(got.kind).toBe(kind);
    expect(got.alpn).toBe(route);
    expect(got.info).toMatchObject({ route, alpn: route, ping: false, serverName: HOST, clientAlpn: [route] });
    expect(got.info.upgraded).toBeUndefined();
    s.destroy();
  });

  it.each(PING_CAPABLE.map((r) => [r]))('%s-ping: same service, suffix kept, info.ping true', async (route) => {
    const offered = `${route}-ping`;
    const s = await connectTls({ alpn: [offered] });
    expect(s.alpnProtocol).toBe(offered);
    expect((await roundTrip(s, `ping over ${offered}`)).toString()).toBe(`ping over ${offered}`);
    const got = await seenFor(s);
    expect(got.service).toBe(route);
    expect(got.alpn).toBe(offered);
    expect(got.info).toMatchObject({ route, alpn: offered, ping: true });
    s.destroy();
  });

  it('the first offered protocol with a route wins: [unknown, gateway-postgres] gets gateway-postgres', async () => {
    const s = await connectTls({ alpn: ['gateway-unknown', 'gateway-postgres', 'gateway-mysql'] });
    expect(s.alpnProtocol).toBe('gateway-postgres');
    expect((await roundTrip(s, 'pg')).toString()).toBe('pg');
    const got = await seenFor(s);
    expect(got.service).toBe('gateway-postgres');
    expect(got.info.clientAlpn).toEqual(['gateway-unknown', 'gateway-postgres', 'gateway-mysql']);
    s.destroy();
  });

  it('a -ping suffix on a protocol that takes none is not routed', async () => {
    const err = await handshakeError({ alpn: ['gateway-reversetunnel-ping'] });
    expect(err.code).toBe('ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL');
  });

  it('gateway-peer is not a route of the one port (peering has its own listener, 3021): the handshake is refused', async () => {
    const err = await handshakeError({ alpn: ['gateway-peer'] });
    expect(err.code).toBe('ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL');
  });

  it.each([['gateway-postgres'], ['gateway-reversetunnel'], ['gateway-tcp-ping']])('openssl s_client -alpn %s: ALPN shown, a line echoes', async (alpn) => {
    const line = `echo-through-openssl-${alpn}-${randomBytes(4).toString('hex')}`;
    const out = await opensslEcho(alpn, line);
    expect(out).toContain(`ALPN protocol: ${alpn}`);
    expect(out).toContain('Verify return code: 0 (ok)');
    expect(out).toContain(`${line}\n`);
  });
});

describe('web, kube, SSH and plain HTTP on the same port', () => {
  it('no ALPN → web: /webapi/ping answers with TLS routing and the web address for every protocol', async () => {
    const res = await httpsGet('/webapi/ping');
    expect(res.status).toBe(200);
    expect(res.headers['content-type']).toBe('application/json');
    const ping = JSON.parse(res.body);
    expect(ping).toMatchObject({ cluster_name: CLUSTER, server_version: VERSION });
    expect(ping.proxy.tls_routing_enabled).toBe(true);
    expect(ping.proxy.ssh).toEqual({
      listen_addr: door.addresses.web,
      tunnel_listen_addr: door.addresses.web,
      web_listen_addr: door.addresses.web,
      public_addr: `${HOST}:443`,
      ssh_public_addr: `${HOST}:443`,
      ssh_tunnel_public_addr: `${HOST}:443`,
    });
    expect(ping.proxy.kube).toEqual({ enabled: true, public_addr: `${HOST}:443`, listen_addr: door.addresses.web });
    expect(ping.proxy.db.postgres_public_addr).toBe(`${HOST}:443`);
  });

  it('a plain tls client without ALPN is routed to the web server, which negotiates no protocol', async () => {
    const s = await connectTls();
    expect(s.alpnProtocol).toBe(false);
    const answer = await new Promise<string>((resolve) => {
      let text = '';
      s.setEncoding('utf8');
      s.on('data', (c: string) => (text += c));
      s.once('end', () => resolve(text));
      s.write(`GET /webapi/find HTTP/1.1\r\nHost: ${HOST}\r\nConnection: close\r\n\r\n`);
    });
    expect(answer).toMatch(/^HTTP\/1\.1 200 /);
    expect(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4))).toMatchObject({ cluster_name: CLUSTER, proxy: { tls_routing_enabled: true } });
  });

  it('http/1.1 → web; other paths reach the api handler', async () => {
    const s = await connectTls({ alpn: ['http/1.1'] });
    expect(s.alpnProtocol).toBe('http/1.1');
    s.destroy();
    const res = await httpsGet('/v1/some/api/call', { alpn: ['http/1.1'] });
    expect(res.status).toBe(200);
    expect(JSON.parse(res.body)).toEqual({ ok: true });
    const ping = await httpsGet('/webapi/ping', { alpn: ['http/1.1'] });
    expect(JSON.parse(ping.body).proxy.tls_routing_enabled).toBe(true);
  });

  it('curl (ALPN h2, http/1.1) and curl --no-alpn reach the web server', async () => {
    const a = await curl('/webapi/ping');
    expect(a.status).toBe(200);
    expect(JSON.parse(a.body).proxy.tls_routing_enabled).toBe(true);
    const b = await curl('/webapi/ping', '--no-alpn');
    expect(b.status).toBe(200);
  });

  it('only unknown ALPN protocols → the handshake fails with no_application_protocol', async () => {
    const before = door.mux!.getStats();
    const err = await handshakeError({ alpn: ['gateway-unknown', 'spdy/3'] });
    expect(err.code).toBe('ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL');
    expect(refusedDelta(before, door.mux!.getStats())).toEqual({ 'no-application-protocol': 1 });
  });

  it(`SNI ${KUBE_SNI} → the kube service, whatever the ALPN`, async () => {
    const s = await connectTls({ servername: KUBE_SNI });
    expect((await roundTrip(s, 'kubectl')).toString()).toBe('kubectl');
    const got = await seenFor(s);
    expect(got.service).toBe('kube');
    expect(got.info).toMatchObject({ route: 'kube', serverName: KUBE_SNI });

    const h2 = await connectTls({ servername: KUBE_SNI, alpn: ['h2', 'http/1.1'] });
    expect((await roundTrip(h2, 'kubectl-h2')).toString()).toBe('kubectl-h2');
    expect((await seenFor(h2)).service).toBe('kube');
    s.destroy();
    h2.destroy();
  });

  it('raw SSH bytes → the ssh service', async () => {
    const s = await connectRaw();
    expect((await roundTrip(s, 'SSH-2.0-test\r\n')).toString()).toBe('SSH-2.0-test\r\n');
    const got = await seenFor(s);
    expect(got.service).toBe('ssh');
    expect(got.info.route).toBe('ssh');
    s.destroy();
  });

  it('plain HTTP → 308 to the same URL over https', async () => {
    const s = await connectRaw();
    s.setEncoding('utf8');
    let text = '';
    s.on('data', (c: string) => (text += c));
    s.write(`GET /x?y=1 HTTP/1.1\r\nHost: ${HOST}:${port}\r\n\r\n`);
    await closed(s);
    expect(text).toMatch(/^HTTP\/1\.1 308 /);
    expect(text).toMatch(new RegExp(`\r\nlocation: https://${HOST.replace(/\./g, '\\.')}:${port}/x\\?y=1\r\n`, 'i'));
  });
});

describe('version server through the front door (curl)', () => {
  it('default channel: the proxy version, text/plain, Cache-Control: no-store', async () => {
    const a = await curl(`${VERSION_PREFIX}/default/version`);
    expect(a.status).toBe(200);
    expect(a.body).toBe(`v${VERSION}`);
    expect(a.body).toBe('v17.0.0-dev');
    expect(a.headers['content-type']).toMatch(/^text\/plain/);
    expect(a.headers['cache-control']).toBe('no-store');
  });

  it('stable/v14: its static version, critical "no"', async () => {
    const v = await curl(`${VERSION_PREFIX}/stable/v14/version`);
    expect(v.status).toBe(200);
    expect(v.body).toBe('v14.3.7');
    expect(v.headers['cache-control']).toBe('no-store');
    const c = await curl(`${VERSION_PREFIX}/stable/v14/critical`);
    expect(c.status).toBe(200);
    expect(c.body).toBe('no');
    expect(c.headers['cache-control']).toBe('no-store');
  });

  it('an unknown channel: 404 JSON with its code, Cache-Control: no-store', async () => {
    const a = await curl(`${VERSION_PREFIX}/nightly/version`);
    expect(a.status).toBe(404);
    expect(a.headers['content-type']).toBe('application/json');
    expect(a.headers['cache-control']).toBe('no-store');
    expect(JSON.parse(a.body).error.code).toBe('GW_ERR_VERSION_UNKNOWN_CHANNEL');
  });
});

describe('PROXY protocol', () => {
  it('a v1 header before the TLS bytes: the service sees the client address from it', async () => {
    const header = buildProxyHeaderV1({ family: 'tcp4', source: { address: '203.0.113.7', port: 40001 }, destination: { address: '198.51.100.1', port: 443 } });
    const s = await tlsAfter(header, 'gateway-postgres');
    expect((await roundTrip(s, 'via v1')).toString()).toBe('via v1');
    const got = await waitSeen((r) => r.info.remoteAddress === '203.0.113.7' && r.info.remotePort === 40001);
    expect(got.service).toBe('gateway-postgres');
    expect(got.info).toMatchObject({ localAddress: '198.51.100.1', localPort: 443 });
    expect(got.client).toEqual({ address: '203.0.113.7', port: 40001 });
    s.destroy();
  });

  it('a v2 header (IPv6) before the TLS bytes: the service sees the client address from it', async () => {
    const header = buildProxyHeaderV2({ family: 'tcp6', source: { address: '2001:db8::7', port: 40002 }, destination: { address: '2001:db8::1', port: 443 }, crc32c: true });
    const s = await tlsAfter(header, 'gateway-tcp');
    expect((await roundTrip(s, 'via v2')).toString()).toBe('via v2');
    const got = await waitSeen((r) => r.info.remoteAddress === '2001:db8::7' && r.info.remotePort === 40002);
    expect(got.service).toBe('gateway-tcp');
    expect(got.info).toMatchObject({ localAddress: '2001:db8::1', localPort: 443 });
    expect(got.client).toEqual({ address: '2001:db8::7', port: 40002 });
    s.destroy();
  });

  it('a v2 LOCAL header (health check) keeps the socket address', async () => {
    const s = await tlsAfter(buildProxyHeaderV2({ command: 'LOCAL' }), 'gateway-redis');
    expect((await roundTrip(s, 'local')).toString()).toBe('local');
    const raw = (s as unknown as { _parent: net.Socket })._parent;
    const got = await seenFor(raw);
    expect(got.service).toBe('gateway-redis');
    s.destroy();
  });

  it('the web (ping) works after a header too', async () => {
    const header = buildProxyHeaderV1({ family: 'tcp4', source: { address: '203.0.113.8', port: 40003 }, destination: { address: '198.51.100.1', port: 443 } });
    const s = await tlsAfter(header, 'http/1.1');
    const answer = await new Promise<string>((resolve) => {
      let text = '';
      s.setEncoding('utf8');
      s.on('data', (c: string) => (text += c));
      s.once('end', () => resolve(text));
      s.write(`GET /webapi/ping HTTP/1.1\r\nHost: ${HOST}\r\nConnection: close\r\n\r\n`);
    });
    expect(answer).toMatch(/^HTTP\/1\.1 200 /);
  });

  it('a second header → closed', async () => {
    const before = door.mux!.getStats();
    const header = buildProxyHeaderV1({ family: 'tcp4', source: { address: '203.0.113.9', port: 40004 }, destination: { address: '198.51.100.1', port: 443 } });
    const s = await connectRaw();
    s.write(Buffer.concat([header, buildProxyHeaderV2({ family: 'tcp4', source: { address: '192.0.2.66', port: 1 }, destination: { address: '198.51.100.1', port: 443 } }), clientHello({ serverName: HOST, alpn: ['gateway-tcp'] })]));
    await closed(s);
    expect(refusedDelta(before, door.mux!.getStats())).toEqual({ 'proxy-protocol-twice': 1 });
    expect(seen.some((r) => r.info.remoteAddress === '192.0.2.66' || r.info.remoteAddress === '203.0.113.9')).toBe(false);
  });

  it('garbage after a valid header → closed', async () => {
    const before = door.mux!.getStats();
    const s = await connectRaw();
    s.write(Buffer.concat([buildProxyHeaderV1({ family: 'tcp4', source: { address: '203.0.113.10', port: 40005 }, destination: { address: '198.51.100.1', port: 443 } }), Buffer.from('\x00\x01garbage\r\n', 'latin1')]));
    await closed(s);
    expect(refusedDelta(before, door.mux!.getStats())).toEqual({ 'unknown-protocol': 1 });
  });

  it('a malformed header → closed', async () => {
    const before = door.mux!.getStats();
    const s = await connectRaw();
    s.write('PROXY TCP4 999.0.0.1 198.51.100.1 1 443\r\n');
    await closed(s);
    expect(refusedDelta(before, door.mux!.getStats())).toEqual({ 'bad-proxy-header': 1 });
  });

  it('with proxy_protocol off, a header → closed (and TLS without one still works)', async () => {
    const off = await startDoor(MULTIPLEX_YAML.replace('proxy_protocol: on', 'proxy_protocol: off'));
    const offPort = portOf(off.addresses.web!);
    const s = await connectRaw(offPort);
    s.write(Buffer.concat([buildProxyHeaderV1({ family: 'tcp4', source: { address: '203.0.113.11', port: 40006 }, destination: { address: '198.51.100.1', port: 443 } }), clientHello({ serverName: HOST, alpn: ['gateway-tcp'] })]));
    await closed(s);
    expect(off.mux!.getStats().refused).toEqual({ 'proxy-protocol-off': 1 });
    const v2 = await connectRaw(offPort);
    v2.write(buildProxyHeaderV2({ command: 'LOCAL' }));
    await closed(v2);
    expect(off.mux!.getStats().refused).toEqual({ 'proxy-protocol-off': 2 });

    const ok = await connectTls({ port: offPort, alpn: ['gateway-mysql'] });
    expect((await roundTrip(ok, 'no header')).toString()).toBe('no header');
    ok.destroy();
  });

  it('proxy_protocol_trusted_sources without 127.0.0.1: a header from here is closed and shows in the connection counters; TLS without one is served', async () => {
    const lines: Array<Record<string, unknown>> = [];
    const log = pino({ level: 'info' }, { write: (l: string) => void lines.push(JSON.parse(l) as Record<string, unknown>) });
    const limits = new ConnectionLimits(limitSettings(config(MULTIPLEX_YAML)), { log, openFiles: null });
    cleanups.push(() => limits.close());
    const listed = await startDoor(MULTIPLEX_YAML.replace('proxy_protocol: on', 'proxy_protocol: on\n  proxy_protocol_trusted_sources: [127.0.0.2]'), { limits });
    const listedPort = portOf(listed.addresses.web!);
    const s = await connectRaw(listedPort);
    s.write(Buffer.concat([buildProxyHeaderV1({ family: 'tcp4', source: { address: '203.0.113.12', port: 40007 }, destination: { address: '198.51.100.1', port: 443 } }), clientHello({ serverName: HOST, alpn: ['gateway-tcp'] })]));
    await closed(s);
    expect(listed.mux!.getStats().refused).toEqual({ 'proxy-protocol-untrusted-source': 1 });
    const ok = await connectTls({ port: listedPort, alpn: ['gateway-tcp'] });
    expect((await roundTrip(ok, 'no header')).toString()).toBe('no header');
    ok.destroy();
    limits.startSummary(20);
    await new Promise<void>((resolve) => {
      const check = setInterval(() => {
        if (lines.some((l) => l.msg === 'connection counters')) {
          clearInterval(check);
          resolve();
        }
      }, 10);
    });
    const summary = lines.find((l) => l.msg === 'connection counters') as { mux?: { refused: Record<string, number> } };
    expect(summary.mux).toEqual({ refused: { 'proxy-protocol-untrusted-source': 1 } });
  });
});

describe('connection upgrade (/webapi/connectionupgrade)', () => {
  it('WebSocket (subprotocol gateway-tcp), TLS inside it with ALPN gateway-tcp: bytes round trip through the service', async () => {
    const ws = await openUpgrade(['gateway-tcp']);
    expect(ws.protocol).toBe('gateway-tcp');
    const mark = seen.length;
    const inner = await connectTls({ socket: createWebSocketStream(ws), alpn: ['gateway-tcp'] });
    expect(inner.alpnProtocol).toBe('gateway-tcp');
    expect(inner.authorized).toBe(true);
    const payload = randomBytes(200 * 1024);
    expect((await roundTrip(inner, payload)).equals(payload)).toBe(true);
    const got = await waitSeen((r) => seen.indexOf(r) >= mark && r.info.upgraded === true);
    expect(got.service).toBe('gateway-tcp');
    expect(got.info).toMatchObject({ route: 'gateway-tcp', alpn: 'gateway-tcp', upgraded: true, remoteAddress: '127.0.0.1' });
    inner.destroy();
  });

  it("after a PROXY header, the upgraded stream's client is the header's address, not the balancer's", async () => {
    const raw = await connectRaw(port);
    raw.write(buildProxyHeaderV1({ family: 'tcp4', source: { address: '203.0.113.44', port: 40044 }, destination: { address: '198.51.100.1', port: 443 } }));
    const options: WebSocket.ClientOptions = { createConnection: () => tls.connect({ socket: raw, servername: HOST, ca: pki.caPem }) };
    const ws = new WebSocket(`wss://127.0.0.1:${port}${UPGRADE_PATH}`, ['gateway-tcp'], options);
    cleanups.push(() => ws.terminate());
    await new Promise<void>((resolve, reject) => {
      ws.once('open', () => resolve());
      ws.once('error', reject);
    });
    const mark = seen.length;
    const inner = await connectTls({ socket: createWebSocketStream(ws), alpn: ['gateway-tcp'] });
    expect((await roundTrip(inner, 'upgraded')).toString()).toBe('upgraded');
    const got = await waitSeen((r) => seen.indexOf(r) >= mark && r.info.upgraded === true);
    expect(got.info).toMatchObject({ route: 'gateway-tcp', upgraded: true, remoteAddress: '203.0.113.44', remotePort: 40044 });
    expect(got.client).toEqual({ address: '203.0.113.44', port: 40044 });
    inner.destroy();
  });

  it('a -ping subprotocol and ALPN route to the base service with ping set', async () => {
    const ws = await openUpgrade(['gateway-postgres-ping']);
    expect(ws.protocol).toBe('gateway-postgres-ping');
    const mark = seen.length;
    const inner = await connectTls({ socket: createWebSocketStream(ws), alpn: ['gateway-postgres-ping'] });
    expect(inner.alpnProtocol).toBe('gateway-postgres-ping');
    expect((await roundTrip(inner, 'SELECT 1')).toString()).toBe('SELECT 1');
    const got = await waitSeen((r) => seen.indexOf(r) >= mark && r.info.upgraded === true);
    expect(got.info).toMatchObject({ route: 'gateway-postgres', alpn: 'gateway-postgres-ping', ping: true });
    inner.destroy();
  });

  it('the inner TLS may only ask for the protocol the upgrade named', async () => {
    const ws = await openUpgrade(['gateway-tcp']);
    const before = door.mux!.getStats();
    await expect(connectTls({ socket: createWebSocketStream(ws), alpn: ['gateway-postgres'] })).rejects.toThrow();
    expect(refusedDelta(before, door.mux!.getStats())).toEqual({ 'no-application-protocol': 1 });
  });

  it('an upgrade naming no routable protocol is refused with 400', async () => {
    const answer = await refusedUpgrade(UPGRADE_PATH, ['gateway-unknown', 'spdy3']);
    expect(answer.status).toBe(400);
    expect(answer.body).toContain('no routable protocol');
  });

  it('a -ping suffix the direct TLS path refuses (gateway-reversetunnel-ping) is refused by the upgrade too', async () => {
    expect((await handshakeError({ alpn: ['gateway-reversetunnel-ping'] })).code).toBe('ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL');
    const answer = await refusedUpgrade(UPGRADE_PATH, ['gateway-reversetunnel-ping']);
    expect(answer.status).toBe(400);
  });

  it('a WebSocket upgrade on another path is refused with 400', async () => {
    const answer = await refusedUpgrade('/webapi/elsewhere', ['gateway-tcp']);
    expect(answer.status).toBe(400);
    expect(answer.body).toContain('no such upgrade endpoint');
  });

  it('a GET without an upgrade → 426 JSON', async () => {
    const res = await httpsGet(UPGRADE_PATH);
    expect(res.status).toBe(426);
    expect(res.headers['content-type']).toBe('application/json');
    expect(JSON.parse(res.body).error.code).toBe('GW_ERR_API_UPGRADE_REQUIRED');
  });

  it('the proxy sends WebSocket pings on an upgraded connection while the stream inside it is idle', async () => {
    const ws = await openUpgrade(['gateway-tcp']);
    const inner = await connectTls({ socket: createWebSocketStream(ws), alpn: ['gateway-tcp'] });
    expect((await roundTrip(inner, 'then idle')).toString()).toBe('then idle');
    await once(ws, 'ping');
    await once(ws, 'ping');
    expect((await roundTrip(inner, 'still open')).toString()).toBe('still open');
    inner.destroy();
  });
});

describe('the transport upgrade (subprotocol gateway-alpn): the stream is routed as a new connection on the port', () => {
  it('the inner ClientHello decides: a resource route, the reverse tunnel, and the web API (no ALPN)', async () => {
    const mark = seen.length;
    const ws = await openUpgrade([UPGRADE_TRANSPORT]);
    expect(ws.protocol).toBe(UPGRADE_TRANSPORT);
    const inner = await connectTls({ socket: createWebSocketStream(ws), alpn: ['gateway-postgres'] });
    expect(inner.alpnProtocol).toBe('gateway-postgres');
    const payload = randomBytes(300 * 1024);
    expect((await roundTrip(inner, payload)).equals(payload)).toBe(true);
    expect((await waitSeen((r) => seen.indexOf(r) >= mark && r.service === 'gateway-postgres')).info).toMatchObject({ upgraded: true, alpn: 'gateway-postgres' });
    inner.destroy();
    const tunnel = await connectTls({ socket: createWebSocketStream(await openUpgrade([UPGRADE_TRANSPORT])), alpn: ['gateway-reversetunnel-v2'] });
    expect((await roundTrip(tunnel, 'agent')).toString()).toBe('agent');
    expect((await waitSeen((r) => seen.indexOf(r) >= mark && r.kind === 'tunnel')).info).toMatchObject({ upgraded: true, route: 'gateway-reversetunnel' });
    tunnel.destroy();
    const web = await connectTls({ socket: createWebSocketStream(await openUpgrade([UPGRADE_TRANSPORT])) });
    web.write(`GET /v1/anything HTTP/1.1\r\nhost: ${HOST}\r\nconnection: close\r\n\r\n`);
    const answer = (await new Promise<Buffer[]>((resolve) => {
      const chunks: Buffer[] = [];
      web.on('data', (c: Buffer) => chunks.push(c));
      web.once('end', () => resolve(chunks));
    })).map(String).join('');
    expect(answer).toMatch(/^HTTP\/1\.1 200/);
    expect(answer).toContain('{"ok":true}');
  });

  it('an upgrade inside an upgraded web connection is refused with 400 (a loop)', async () => {
    const web = await connectTls({ socket: createWebSocketStream(await openUpgrade([UPGRADE_TRANSPORT])) });
    const nested = new WebSocket(`wss://${HOST}${UPGRADE_PATH}`, [UPGRADE_TRANSPORT], { createConnection: () => web });
    cleanups.push(() => {
      nested.on('error', () => undefined); // terminate() before a 101 emits an error: the refusal is what this test expects
      nested.terminate();
    });
    const [, res] = (await once(nested, 'unexpected-response')) as [unknown, { statusCode: number; resume(): void }];
    res.resume();
    expect(res.statusCode).toBe(400);
  });

  it('a client that stalls after the 101, and one that sends garbage inside, are closed by the multiplexer (detect deadline, unknown protocol)', async () => {
    const before = door.mux!.getStats();
    const stalled = await openUpgrade([UPGRADE_TRANSPORT]);
    const garbage = await openUpgrade([UPGRADE_TRANSPORT]);
    garbage.send(Buffer.from('\x00\xffnot a protocol\r\n'));
    await Promise.all([once(stalled, 'close'), once(garbage, 'close')]);
    expect(refusedDelta(before, door.mux!.getStats())).toEqual({ 'detect-timeout': 1, 'unknown-protocol': 1 });
  });

  it('a WebSocket message over the 1 MiB cap closes the stream (1009), and the door serves on', async () => {
    const ws = await openUpgrade([UPGRADE_TRANSPORT]);
    ws.send(Buffer.alloc(UPGRADE_MAX_PAYLOAD + 1));
    const [code] = (await once(ws, 'close')) as [number];
    expect(code).toBe(1009);
    const inner = await connectTls({ socket: createWebSocketStream(await openUpgrade([UPGRADE_TRANSPORT])), alpn: ['gateway-tcp'] });
    expect((await roundTrip(inner, 'still here')).toString()).toBe('still here');
    inner.destroy();
  });

  it('an upgrade request with oversized headers is refused (431) before any upgrade', async () => {
    const raw = await connectTls({});
    raw.write(`GET ${UPGRADE_PATH} HTTP/1.1\r\nhost: ${HOST}\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-protocol: ${UPGRADE_TRANSPORT}\r\nx-big: ${'a'.repeat(64 * 1024)}\r\n\r\n`);
    const chunks: Buffer[] = [];
    raw.on('data', (c: Buffer) => chunks.push(c));
    await once(raw, 'close');
    expect(Buffer.concat(chunks).toString()).toMatch(/^HTTP\/1\.1 431/);
  });
});

describe('hostile input', () => {
  it('the hand-made ClientHellos parse as intended', () => {
    const ok = parseClientHello(clientHello({ serverName: HOST, alpn: ['gateway-postgres'] }));
    expect(ok).toMatchObject({ kind: 'hello', serverName: HOST, alpn: ['gateway-postgres'] });
    const big = clientHello({ serverName: hugeServerName(), alpn: ['gateway-postgres'] });
    expect(big.length).toBeGreaterThan(64 * 1024);
    expect(() => parseClientHello(big)).toThrow(expect.objectContaining({ code: 'GW_ERR_MUX_HELLO_TOO_LARGE' }));
  });

  it('a hand-made ClientHello is routed like a real one (the route completes nothing, but it is counted)', async () => {
    const before = door.mux!.getStats();
    const s = await connectRaw();
    s.write(clientHello({ serverName: HOST, alpn: ['gateway-mongodb'] }));
    // Our hello has no key share, so the routed TLS server fails the handshake: only the routing is checked.
    await closed(s);
    expect(door.mux!.getStats().routed['gateway-mongodb']).toBe((before.routed['gateway-mongodb'] ?? 0) + 1);
  });

  it('garbage, a cut ClientHello, silence, a slow trickle and a 64 KiB server name are closed; a normal client is served meanwhile', async () => {
    const before = door.mux!.getStats();
    const hello = clientHello({ serverName: HOST, alpn: ['gateway-postgres'] });

    const garbage = await connectRaw();
    garbage.write(Buffer.from([0x00, 0xff, 0x13, 0x37, ...Buffer.from('garbage\r\n')]));
    const half = await connectRaw();
    half.write(hello.subarray(0, Math.floor(hello.length / 2)));
    const silent = await connectRaw();
    const slow = await connectRaw();
    trickle(slow, hello);
    const huge = await connectRaw();
    huge.write(clientHello({ serverName: hugeServerName(), alpn: ['gateway-postgres'] }));
    const hostile = [garbage, half, silent, slow, huge];

    // While those are pending, other clients get through: a TLS route, the web and SSH.
    const normal = await connectTls({ alpn: ['gateway-postgres'] });
    expect((await roundTrip(normal, 'still serving')).toString()).toBe('still serving');
    normal.destroy();
    expect((await httpsGet('/webapi/ping')).status).toBe(200);
    const ssh = await connectRaw();
    expect((await roundTrip(ssh, 'SSH-2.0-meanwhile\r\n')).toString()).toBe('SSH-2.0-meanwhile\r\n');
    ssh.destroy();

    await Promise.all(hostile.map(closed));
    // Each was refused for what it sent: garbage and the huge hello at once, the rest at the detect deadline.
    expect(refusedDelta(before, door.mux!.getStats())).toEqual({ 'unknown-protocol': 1, 'hello-too-large': 1, 'detect-timeout': 3 });
    expect(door.mux!.getStats().detecting).toBe(0);

    // And the door still serves.
    const after = await connectTls({ alpn: ['gateway-redis'] });
    expect((await roundTrip(after, 'after')).toString()).toBe('after');
    after.destroy();
  });

  it('a hello that announces more than the limit in its first record header is closed at once', async () => {
    const before = door.mux!.getStats();
    const s = await connectRaw();
    // Record of 2^14 bytes whose handshake header announces a 1 MiB ClientHello.
    s.write(Buffer.concat([u8(22), u16(0x0301), u16(16384), u8(1), u24(1 << 20), randomBytes(100)]));
    await closed(s);
    expect(refusedDelta(before, door.mux!.getStats())).toEqual({ 'hello-too-large': 1 });
  });

  it('a malformed ClientHello is closed at once', async () => {
    const before = door.mux!.getStats();
    const s = await connectRaw();
    const hello = clientHello({ serverName: HOST, alpn: ['gateway-postgres'] });
    hello[9] = 0x07; // legacy_version major 7
    s.write(hello);
    await closed(s);
    expect(refusedDelta(before, door.mux!.getStats())).toEqual({ 'bad-hello': 1 });
  });

  it('an SSH or HTTP line through a connection upgrade is refused (only TLS is routed there)', async () => {
    const ws = wsClient(UPGRADE_PATH, ['gateway-tcp']);
    await once(ws, 'open');
    const before = door.mux!.getStats();
    const stream = createWebSocketStream(ws);
    stream.on('error', () => undefined);
    stream.resume();
    stream.write('SSH-2.0-sneaky\r\n');
    await once(ws, 'close');
    expect(refusedDelta(before, door.mux!.getStats())).toEqual({ 'ssh-not-served': 1 });
  });
});

describe('separate listeners (proxy_listener_mode: separate)', () => {
  let sep: FrontDoor;

  beforeAll(async () => {
    sep = await startDoor(separateYaml());
  });

  it('the transport upgrade is served on the web listener and routes by the inner ClientHello there too (a database, the tunnel over TLS)', async () => {
    const webPort = portOf(sep.addresses.web!);
    const open = () => {
      const ws = new WebSocket(`wss://127.0.0.1:${webPort}${UPGRADE_PATH}`, [UPGRADE_TRANSPORT], { ca: pki.caPem, servername: HOST } as WebSocket.ClientOptions);
      cleanups.push(() => ws.terminate());
      return new Promise<WebSocket>((resolve, reject) => {
        ws.once('open', () => resolve(ws));
        ws.once('error', reject);
      });
    };
    const mark = seen.length;
    const db = await connectTls({ socket: createWebSocketStream(await open()), alpn: ['gateway-mysql'] });
    expect((await roundTrip(db, 'select 1')).toString()).toBe('select 1');
    const tunnel = await connectTls({ socket: createWebSocketStream(await open()), alpn: ['gateway-reversetunnel-v2'] });
    expect((await roundTrip(tunnel, 'agent')).toString()).toBe('agent');
    const routed = seen.slice(mark).filter((r) => r.info.upgraded === true).map((r) => r.service).sort();
    expect(routed).toEqual(['gateway-mysql', 'gateway-reversetunnel']);
    db.destroy();
    tunnel.destroy();
  });

  it('binds every listener of the table (kube too, since kube_listen_addr is set); peering is not one of them', () => {
    expect(Object.keys(sep.addresses).sort()).toEqual(['kube', 'mongo', 'mysql', 'postgres', 'redis', 'ssh', 'tunnel', 'web']);
    for (const addr of Object.values(sep.addresses)) expect(addr).toMatch(/^127\.0\.0\.1:\d+$/);
  });

  it('web serves HTTPS directly: ping without TLS routing, each protocol at its own port', async () => {
    const webPort = portOf(sep.addresses.web!);
    const res = await httpsGet('/webapi/ping', { port: webPort });
    expect(res.status).toBe(200);
    const ping = JSON.parse(res.body);
    expect(ping.proxy.tls_routing_enabled).toBe(false);
    expect(ping.proxy.ssh).toMatchObject({
      listen_addr: sep.addresses.ssh,
      tunnel_listen_addr: sep.addresses.tunnel,
      web_listen_addr: sep.addresses.web,
      public_addr: `${HOST}:443`,
      ssh_public_addr: `${HOST}:${portOf(sep.addresses.ssh!)}`,
      ssh_tunnel_public_addr: `${HOST}:${portOf(sep.addresses.tunnel!)}`,
    });
    expect((await httpsGet('/v1/x', { port: webPort })).body).toBe('{"ok":true}');
    expect((await httpsGet(`${VERSION_PREFIX}/stable/v14/version`, { port: webPort })).body).toBe('v14.3.7');
  });

  it('ping: each database protocol of the table at its own bound port (Redis too), under the public host', async () => {
    const ping = JSON.parse((await httpsGet('/webapi/ping', { port: portOf(sep.addresses.web!) })).body);
    const expected: Record<string, string> = {};
    for (const row of WIRE_PROTOCOLS) {
      if (!('pingDb' in row)) continue;
      expected[row.pingDb.public] = `${HOST}:${portOf(sep.addresses[row.listener.name]!)}`;
      if ('listen' in row.pingDb) expected[row.pingDb.listen] = sep.addresses[row.listener.name]!;
    }
    expect(ping.proxy.db).toEqual(expected);
    expect(Object.keys(expected)).toContain('redis_public_addr');
  });

  it('the web port is HTTPS only: no TLS routing there', async () => {
    const err = await handshakeError({ port: portOf(sep.addresses.web!), alpn: ['gateway-postgres'] });
    expect(err.code).toBe('ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL');
  });

  it('the other listeners accept connections; ssh, tunnel and kube reach their services', async () => {
    for (const name of ['mysql', 'postgres', 'mongo', 'redis']) {
      const s = await connectRaw(portOf(sep.addresses[name]!));
      s.destroy();
    }
    const ssh = await connectRaw(portOf(sep.addresses.ssh!));
    expect((await roundTrip(ssh, 'SSH-2.0-sep\r\n')).toString()).toBe('SSH-2.0-sep\r\n');
    expect((await seenFor(ssh)).service).toBe('ssh');
    ssh.destroy();

    const tunnel = await connectRaw(portOf(sep.addresses.tunnel!));
    expect((await roundTrip(tunnel, 'SSH-2.0-agent\r\n')).toString()).toBe('SSH-2.0-agent\r\n');
    expect(await seenFor(tunnel)).toMatchObject({ service: 'tunnel', kind: 'tunnel', alpn: undefined });
    tunnel.destroy();

    const kube = await connectTls({ port: portOf(sep.addresses.kube!) });
    expect((await roundTrip(kube, 'kube')).toString()).toBe('kube');
    expect((await seenFor(kube)).service).toBe('kube');
    kube.destroy();
  });

  it.each(listenerRows().map((row) => [row.listener.key] as const))('%s: an address in use → GW_ERR_LISTEN naming it and its key', async (key) => {
    const blocker = net.createServer();
    await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => new Promise((resolve) => blocker.close(resolve)));
    const busy = `127.0.0.1:${(blocker.address() as net.AddressInfo).port}`;
    const err = await startDoor(separateYaml({ [key]: busy })).then(() => undefined, (e: unknown) => e);
    expect(isGatewayError(err, 'GW_ERR_LISTEN')).toBe(true);
    expect((err as Error).message).toContain(`${busy} (proxy_service.${key})`);
    expect((err as GatewayError).hint).toContain(`proxy_service.${key}`);
  });

  it('two listeners on one address (redis_listen_addr = mysql_listen_addr) → GW_ERR_LISTEN naming both keys, before anything binds', async () => {
    const port = await getPort({ host: '127.0.0.1' });
    const webPort = await getPort({ host: '127.0.0.1' });
    for (const other of [`127.0.0.1:${port}`, `0.0.0.0:${port}`]) {
      const err = await startDoor(separateYaml({ web_listen_addr: `127.0.0.1:${webPort}`, mysql_listen_addr: other, redis_listen_addr: `127.0.0.1:${port}` })).then(() => undefined, (e: unknown) => e);
      expect(isGatewayError(err, 'GW_ERR_LISTEN')).toBe(true);
      expect((err as Error).message).toContain('proxy_service.redis_listen_addr');
      expect((err as Error).message).toContain('proxy_service.mysql_listen_addr is the same address');
      expect((err as GatewayError).hint).toContain('proxy_service.redis_listen_addr a port of its own');
    }
    // Nothing was bound: the web port is free.
    const probe = net.createServer();
    await new Promise<void>((resolve, reject) => {
      probe.once('error', reject);
      probe.listen(webPort, '127.0.0.1', resolve);
    });
    await new Promise((resolve) => probe.close(resolve));
  });

  it('a listen address already in use → GW_ERR_LISTEN naming the address, and nothing stays bound', async () => {
    const blocker = net.createServer();
    await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
    cleanups.push(() => new Promise((resolve) => blocker.close(resolve)));
    const busy = `127.0.0.1:${(blocker.address() as net.AddressInfo).port}`;
    const webPort = await getPort({ host: '127.0.0.1' });

    for (const yaml of [
      separateYaml({ web_listen_addr: `127.0.0.1:${webPort}`, listen_addr: busy }),
      MULTIPLEX_YAML.replace('web_listen_addr: 127.0.0.1:0', `web_listen_addr: ${busy}`),
    ]) {
      const err = await startDoor(yaml).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(isGatewayError(err, 'GW_ERR_LISTEN')).toBe(true);
      expect((err as Error).message).toContain(busy);
    }

    // The web listener bound before the failure was closed again.
    const probe = net.createServer();
    await new Promise<void>((resolve, reject) => {
      probe.once('error', reject);
      probe.listen(webPort, '127.0.0.1', resolve);
    });
    await new Promise((resolve) => probe.close(resolve));
  });
});
