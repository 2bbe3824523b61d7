/**
 * Proxy peering between two real daemons: Proxy A and Proxy B (each `gateway start` with auth + proxy) share one
 * PostgreSQL (test/helpers/databases.ts), so they are one cluster with auth_service.tunnel_strategy proxy_peering.
 * An app agent joins through B and keeps its only tunnel there; a user logged in through A reaches the agent's
 * TCP app (gwsh proxy app) through A, which carries the stream over B's peering listener (3021). Bytes are
 * checked end to end, one large transfer and many concurrent streams (the default transport, a TLS connection per
 * stream). The link between A and B's peering port runs through a relay B publishes as its peer_public_addr: cut
 * (new connections through A fail with a clear error; a transfer under way is reset at the client, never ended) and
 * restored (they work again). These go the classic way (gwsh --e2e off); end to end (--e2e require), the stream
 * goes through A raw to B's peering listener (A logs it forwarded, B routed, B records the session with e2e: true),
 * and A, run as a compromised Proxy (test/helpers/compromised-proxy.cjs records every byte its sockets deliver),
 * holds none of the stream's bytes, where it holds the classic route's.
 * B's peering port refuses a
 * client without a certificate on either transport (gateway-peer, gateway-peer-tls) and garbage; the in-process
 * suite (test/proxy/peer.test.ts) has every other hostile case.
 */
import { type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startPostgres, type PostgresServer } from '../helpers/databases.js';
import { waitUntil } from '../helpers/wait.js';
import { rootSuite } from '../helpers/root.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';

let dir: string;
let pg: PostgresServer;
let a: RunningGateway;
let b: RunningGateway;
let agent: RunningGateway;
let echo: net.Server;
let localPort: number;
let userEnv: Record<string, string>;
let peerPortB: number;
const children: ChildProcess[] = [];

/**
 * The link between A and B's peering port: a TCP relay whose address B publishes as its peer_public_addr, so
 * that A's every peering connection crosses it. cut() drops what crosses it and refuses new connections;
 * restore() lets them through again.
 */
class PeerLink {
  private readonly sockets = new Set<net.Socket>();
  private server: net.Server | undefined;
  constructor(readonly port: number, private readonly target: () => number) {}

  async restore(): Promise<void> {
    this.server = net.createServer((inbound) => {
      const outbound = net.connect(this.target(), '127.0.0.1');
      for (const s of [inbound, outbound]) {
        this.sockets.add(s);
        s.on('error', () => undefined);
        s.once('close', () => this.sockets.delete(s));
      }
      inbound.pipe(outbound).pipe(inbound);
      inbound.once('close', () => outbound.destroy());
      outbound.once('close', () => inbound.destroy());
    });
    await new Promise<void>((r) => this.server!.listen(this.port, '127.0.0.1', r));
  }

  async cut(): Promise<void> {
    const closed = new Promise((r) => (this.server ? this.server.close(r) : r(undefined)));
    for (const s of this.sockets) s.destroy();
    await closed;
    this.server = undefined;
  }
}

let link: PeerLink;

const PRELOAD = new URL('../helpers/compromised-proxy.cjs', import.meta.url).pathname;
const recordDir = () => join(dir, 'record-a');
/** Everything A's process held, one file per socket (-tls.bin: plaintext A decrypted; -raw.bin: bytes it did not). */
async function recordedAtA(): Promise<Array<{ name: string; bytes: Buffer }>> {
  return Promise.all((await readdir(recordDir())).sort().map(async (name) => ({ name, bytes: await readFile(join(recordDir(), name)) })));
}

const proxyYaml = (name: string, web: number, peer: number, conn: string, peerPublic?: number) =>
  [
    'gateway:',
    `  nodename: ${name}`,
    '  data_dir: DATA_DIR',
    '  log: { format: json, severity: debug }',
    '  limits: { tls_handshake_timeout: 2s, header_timeout: 2s }',
    `  storage: { type: postgres, conn_string: "${conn}" }`,
    'auth_service:',
    '  cluster_name: peering.example',
    '  listen_addr: 127.0.0.1:0',
    '  tunnel_strategy: { type: proxy_peering, agent_connection_count: 1 }',
    'proxy_service:',
    `  web_listen_addr: 127.0.0.1:${web}`,
    `  public_addr: localhost:${web}`,
    `  peer_listen_addr: 127.0.0.1:${peer}`,
    ...(peerPublic ? [`  peer_public_addr: 127.0.0.1:${peerPublic}`] : []),
    '',
  ].join('\n');

/** Sends `data` through a fresh connection to gwsh's local listener and resolves with the sha256 of the echo. */
function echoThrough(data: Buffer, port = localPort): Promise<string> {
  return new Promise((resolve, reject) => {
    const hash = createHash('sha256');
    let got = 0;
    const s = net.connect({ port, host: '127.0.0.1' }, () => s.write(data));
    s.on('data', (c: Buffer) => {
      hash.update(c);
      got += c.length;
      if (got >= data.length) {
        s.destroy();
        resolve(hash.digest('hex'));
      }
    });
    s.once('error', reject);
    s.once('close', () => got < data.length && reject(new Error(`closed after ${got} of ${data.length} bytes`)));
  });
}

/**
 * gwsh proxy app echo in its own process: resolves with its local port, rejects when it exits (not reachable yet).
 * The classic route (--e2e off) unless said: the agent offers end-to-end streams, which go over peering raw.
 */
async function echoProxy(env: Record<string, string>, e2e: 'off' | 'require' = 'off'): Promise<number> {
  return (await startGwshProxy(['app', 'echo', '--e2e', e2e], env, children)).port;
}

const sha256 = (d: Buffer) => createHash('sha256').update(d).digest('hex');

rootSuite(['dbUsers'])('Proxy peering between two daemons on one PostgreSQL', () => {
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'gw-e2e-peer-'));
    pg = await startPostgres({ port: await getPort({ host: '127.0.0.1' }) });
    // An echo; a connection whose first line is `download N` gets N bytes instead (a download with nothing sent
    // the other way, so that nothing is left unread when a hop dies: a FIN, not the kernel's RST).
    echo = net.createServer((s) => {
      s.on('error', () => undefined);
      s.once('data', (first: Buffer) => {
        const m = /^download (\d+)\n/.exec(first.subarray(0, 32).toString('latin1'));
        s.pause();
        if (!m) {
          s.unshift(first);
          s.pipe(s);
          return;
        }
        const chunk = Buffer.alloc(1024 * 1024, 0x64);
        let left = Number(m[1]);
        const pump = () => {
          while (left > 0 && !s.destroyed) {
            left -= chunk.length;
            if (!s.write(chunk)) return void s.once('drain', pump);
          }
          if (!s.destroyed) s.end();
        };
        pump();
      });
    });
    await new Promise<void>((r) => echo.listen(0, '127.0.0.1', r));
    const [webA, webB, peerA] = [await getPort({ host: '127.0.0.1' }), await getPort({ host: '127.0.0.1' }), await getPort({ host: '127.0.0.1' })];
    peerPortB = await getPort({ host: '127.0.0.1' });
    link = new PeerLink(await getPort({ host: '127.0.0.1' }), () => peerPortB);
    await link.restore();
    // A runs with the compromised-Proxy recorder (test/helpers/compromised-proxy.cjs): every chunk its sockets deliver.
    await mkdir(recordDir(), { recursive: true });
    a = await startGateway(proxyYaml('proxy-a', webA, peerA, pg.url()), { env: { NODE_OPTIONS: `--require ${PRELOAD}`, GW_TEST_RECORD: recordDir() } });
    b = await startGateway(proxyYaml('proxy-b', webB, peerPortB, pg.url(), link.port));
    const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', b.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });
    const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
    const token = (JSON.parse((await admin(['tokens', 'add', '--type=app', '--format', 'json'])).stdout) as { token: string }).token;
    await admin(['users', 'add', 'alice', '--roles=access'], 'correct horse battery\n');
    const echoPort = (echo.address() as net.AddressInfo).port;
    agent = await startGateway(
      ['gateway:', '  nodename: agent-b', '  data_dir: DATA_DIR', '  log: { format: json }', 'app_service:', '  enabled: yes', '  apps:', `    - { name: echo, uri: "tcp://127.0.0.1:${echoPort}" }`, ''].join('\n'),
      { args: ['--token', token, '--ca-pin', pin, '--proxy', `localhost:${webB}`] },
    );
    await agent.waitForLog('reverse tunnel ready');
    const env = { HOME: dir, GWSH_HOME: join(dir, 'alice') };
    userEnv = env;
    expect((await runCli('gwsh', ['login', `--proxy=localhost:${webA}`, '--user=alice', `--ca-pin=${pin}`], { env, input: 'correct horse battery\n' })).status).toBe(0);
    // A learns from the shared backend that B holds the agent's tunnel; until then gwsh's start check is refused.
    await waitUntil('gwsh proxy app reaches the app through A', async () => {
      const port = await echoProxy(env).catch(() => undefined);
      if (port !== undefined) localPort = port;
      return port !== undefined;
    }, 30_000, 250);
  }, 120_000);

  afterAll(async () => {
    for (const c of children) c.kill('SIGTERM');
    await agent?.stop();
    await a?.stop();
    await b?.stop();
    echo?.close();
    await pg?.stop();
    await link?.cut();
    await rm(dir, { recursive: true, force: true });
  });

  describe('a client through A reaches the agent whose tunnel B holds', () => {
    it('8 MiB come back byte for byte, and A carried them over peering', async () => {
      const data = randomBytes(8 * 1024 * 1024);
      expect(await echoThrough(data)).toBe(sha256(data));
      // The recorder's control: on the classic route A decrypts the stream, and holds its bytes.
      expect((await recordedAtA()).some((f) => f.name.endsWith('-tls.bin') && f.bytes.includes(data.subarray(1_000_003, 1_000_051)))).toBe(true);
      expect(a.logs()).not.toContain('"msg":"agent connected"');
      expect(b.logs()).toContain('peered stream opened');
      // One emitter per session: A, where the client is, records it; B, which only carried it to the agent, does not.
      const proxies = JSON.parse((await runCli('gwctl', ['--data-dir', b.dataDir, 'get', 'proxies', '--format', 'json'], { env: { HOME: dir } })).stdout) as Array<{ metadata: { name: string }; spec: { hostname: string } }>;
      const idOf = (host: string) => proxies.find((p) => p.spec.hostname === host)?.metadata.name;
      await waitUntil('the 8 MiB session recorded', async () => {
        const r = await runCli('gwctl', ['--data-dir', b.dataDir, 'get', 'events', '--format', 'json'], { env: { HOME: dir } });
        const ends = (JSON.parse(r.stdout) as Array<{ spec: Record<string, unknown> }>).map((e) => e.spec).filter((e) => e.event === 'app.session.end' && e.bytes_in === data.length);
        if (ends.length === 0) return false;
        expect(ends).toHaveLength(1);
        expect(ends[0]).toMatchObject({ user: 'alice', resource: 'echo', node: 'agent-b', bytes_out: data.length, reported_by: { proxy_id: idOf('proxy-a') } });
        return true;
      }, 30_000);
    }, 60_000);

    it('30 concurrent streams each get their own bytes back', async () => {
      const results = await Promise.all(
        Array.from({ length: 30 }, async (_, i) => {
          const data = randomBytes(32 * 1024 + i);
          return (await echoThrough(data)) === sha256(data);
        }),
      );
      expect(results.every(Boolean)).toBe(true);
    }, 60_000);
  });

  describe('end to end through A (gwsh proxy app --e2e require): raw over 3021, no second encryption', () => {
    it("4 MiB come back byte for byte; A forwarded the stream to B, B routed it to the agent's data connection and recorded it", async () => {
      const proxies = JSON.parse((await runCli('gwctl', ['--data-dir', b.dataDir, 'get', 'proxies', '--format', 'json'], { env: { HOME: dir } })).stdout) as Array<{ metadata: { name: string }; spec: { hostname: string } }>;
      const idOf = (host: string) => proxies.find((p) => p.spec.hostname === host)?.metadata.name;
      // A grants once it sees B's presence of the agent with the e2e capability (the backend is shared).
      let port: number | undefined;
      await waitUntil('gwsh proxy app --e2e require through A', async () => (port = await echoProxy(userEnv, 'require').catch(() => undefined)) !== undefined, 30_000, 250);
      const data = randomBytes(4 * 1024 * 1024);
      expect(await echoThrough(data, port)).toBe(sha256(data));
      // A, compromised, held none of it: no slice of the random bytes in anything its sockets delivered, while the
      // stream's line did pass through it raw (and the classic route's bytes, decrypted, are in its -tls.bin files).
      const held = await recordedAtA();
      const slices = [0, 1_000_003, 3_000_017].map((at) => data.subarray(at, at + 48));
      expect(held.filter((f) => slices.some((x) => f.bytes.includes(x))).map((f) => f.name)).toEqual([]);
      expect(held.some((f) => f.name.endsWith('-raw.bin') && f.bytes.includes('GWE2E1 '))).toBe(true);
      await waitUntil('A logs the stream forwarded', () => a.logs().includes('end-to-end stream forwarded'));
      const forwarded = a.logs().split('\n').find((l) => l.includes('end-to-end stream forwarded'))!;
      expect(JSON.parse(forwarded)).toMatchObject({ user: 'alice', resource: 'echo', peer: idOf('proxy-b') });
      expect(b.logs()).toContain('end-to-end stream routed');
      expect(a.logs()).not.toContain('end-to-end stream routed');
      // The session is B's to record (it routed it to the agent), with e2e: true; and the agent's own.
      await waitUntil('the 4 MiB end-to-end session recorded by B', async () => {
        const r = await runCli('gwctl', ['--data-dir', b.dataDir, 'get', 'events', '--format', 'json'], { env: { HOME: dir } });
        const ends = (JSON.parse(r.stdout) as Array<{ spec: Record<string, unknown> }>).map((e) => e.spec).filter((e) => e.event === 'app.session.end' && e.e2e === true && (e.reported_by as { proxy_id?: string } | undefined)?.proxy_id === idOf('proxy-b'));
        return ends.some((e) => (e.bytes_in as number) >= data.length);
      }, 30_000);
    }, 90_000);
  });

  describe('the 3021 link between A and B', () => {
    it('cut: a new client connection through A fails (nothing reaches the agent); restored: bytes flow again, byte for byte', async () => {
      const data = randomBytes(256 * 1024);
      expect(await echoThrough(data)).toBe(sha256(data));
      await link.cut();
      await expect(echoThrough(randomBytes(1024))).rejects.toThrow();
      expect(a.logs()).toMatch(/GW_ERR_PEER_UNREACHABLE|GW_ERR_TUNNEL_NOT_FOUND/);
      await link.restore();
      await waitUntil('a new connection through A works again', async () => (await echoThrough(data).catch(() => '')) === sha256(data), 30_000, 250);
      const after = randomBytes(4 * 1024 * 1024);
      expect(await echoThrough(after)).toBe(sha256(after));
    }, 90_000);

    it('HOSTILE: cut during a download (the peer gone: a FIN): the client sees its connection reset, not an end', async () => {
      const outcome = await new Promise<{ how: string; got: number }>((resolve) => {
        const s = net.connect({ port: localPort, host: '127.0.0.1', allowHalfOpen: true });
        let got = 0;
        let cutting = false;
        s.on('error', (err: NodeJS.ErrnoException) => resolve({ how: `reset (${err.code})`, got }));
        // An end is checked with a zero-length write: libuv reports an RST right behind data as an end.
        s.once('end', () => s.write(Buffer.alloc(0), (err) => resolve({ how: err ? 'reset (after the end)' : 'clean end', got })));
        s.on('data', (c: Buffer) => {
          got += c.length;
          if (got >= 16 * 1024 * 1024 && !cutting) {
            cutting = true;
            void link.cut();
          }
        });
        s.once('connect', () => s.write(`download ${4096 * 1024 * 1024}\n`));
      });
      expect(outcome.how, `after ${outcome.got} bytes`).toMatch(/^reset/);
      await link.restore();
      const data = randomBytes(256 * 1024);
      await waitUntil('a new connection through A works again', async () => (await echoThrough(data).catch(() => '')) === sha256(data), 30_000, 250);
    }, 90_000);
  });

  describe("B's peering port (3021) is not open to anyone", () => {
    it.each(['gateway-peer', 'gateway-peer-tls'])('a TLS client without a certificate is closed (ALPN %s)', async (alpn) => {
      const refusals = b.logs().split('peer refused').length;
      const s = tls.connect({ host: '127.0.0.1', port: peerPortB, rejectUnauthorized: false, ALPNProtocols: [alpn] });
      s.on('error', () => undefined);
      s.resume();
      if (alpn === 'gateway-peer-tls') s.once('secureConnect', () => s.write('{"hostId":"x","request":{}}\n'));
      await new Promise((r) => s.once('close', r));
      await waitUntil('B logs the refusal', () => b.logs().split('peer refused').length > refusals);
    });

    it('garbage bytes are closed', async () => {
      const s = net.connect(peerPortB, '127.0.0.1');
      s.on('error', () => undefined);
      s.resume();
      s.write(randomBytes(2048));
      await new Promise((r) => s.once('close', r));
    });
  });
});
