/**
 * End-to-end streams through real daemons, and what a compromised Proxy can do to them (issue 29; docs/security.md
 * "End-to-end streams: what a compromised Proxy sees"). An Auth Service and Proxy in one process, an agent whose only
 * way to the Proxy is a real squid (the Proxy's name is known to squid only), a TCP app that echoes and keeps what it
 * received, and `gwsh proxy app` as a user runs it.
 *
 * The compromised Proxy is the real daemon with a preload (test/helpers/compromised-proxy.cjs) that sees every chunk
 * any of its sockets hands to its JavaScript (the plaintext of every TLS connection it terminates, with its own keys)
 * and records it, or flips a byte of a relayed end-to-end stream before its code relays it. The recorder is shown to
 * see plaintext where the Proxy has it (the classic route), so its finding nothing on the end-to-end path means
 * something.
 *
 *   recording   an end-to-end stream's bytes appear nowhere in what the Proxy held; the classic route's do
 *   replay      the raw bytes of a used end-to-end connection, sent again, are refused (the grant is single-use)
 *   altering    a flipped byte breaks the stream at the client; the app never receives an altered byte
 *   audit       the Proxy and the agent both record the session, the agent's naming the grant
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BIN, runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { waitUntil } from '../helpers/wait.js';

const PROXY_IP = '127.0.0.3';
const PROXY_NAME = 'e2e.gw.test';
const PASSWORD = 'correct horse battery';
const PRELOAD = new URL('../helpers/compromised-proxy.cjs', import.meta.url).pathname;
/** The altering Proxy flips this byte of an end-to-end connection's raw bytes: well past the handshake. */
const ALTER_AT = 48 * 1024;

let dir: string;
let squid: Squid;
let app: KeepingEcho;
const children: ChildProcess[] = [];
const gateways: RunningGateway[] = [];

/** A TCP echo server that also keeps every byte it received, per connection. */
interface KeepingEcho {
  port: number;
  received: Buffer[][];
  close(): Promise<void>;
}

async function keepingEcho(): Promise<KeepingEcho> {
  const received: Buffer[][] = [];
  const server = net.createServer((s) => {
    const mine: Buffer[] = [];
    received.push(mine);
    s.on('error', () => undefined);
    s.on('data', (c: Buffer) => {
      mine.push(c);
      s.write(c);
    });
    s.on('end', () => s.end());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { port: (server.address() as net.AddressInfo).port, received, close: () => new Promise((resolve) => server.close(() => resolve())) };
}

interface Cluster {
  proxy: RunningGateway;
  agent: RunningGateway;
  userEnv: Record<string, string>;
  webPort: number;
  gwctl(args: string[]): Promise<string>;
}

/** A cluster whose Proxy runs with the compromised preload and `env`; an agent through squid; alice signed in. */
async function cluster(name: string, env: Record<string, string>): Promise<Cluster> {
  const webPort = await getPort({ host: PROXY_IP });
  const proxy = await startGateway(
    ['gateway:', `  nodename: proxy-${name}`, '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', `  cluster_name: ${name}.example`, '  listen_addr: 127.0.0.1:0', 'proxy_service:', `  web_listen_addr: ${PROXY_IP}:${webPort}`, `  public_addr: ${PROXY_NAME}:${webPort}`, ''].join('\n'),
    { env: { NODE_OPTIONS: `--require ${PRELOAD}`, ...env } },
  );
  gateways.push(proxy);
  const home = join(dir, name);
  await mkdir(home, { recursive: true });
  const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', proxy.dataDir, ...args], { env: { HOME: home }, ...(input ? { input } : {}) });
  const pin = /CA pin:\s+(\S+)/.exec((await admin(['status'])).stdout)![1]!;
  expect((await admin(['users', 'add', 'alice', '--roles=access'], `${PASSWORD}\n`)).status).toBe(0);
  const token = (JSON.parse((await admin(['tokens', 'add', '--type=app', '--format', 'json'])).stdout) as { token: string }).token;
  const agent = await startGateway(['gateway:', `  nodename: agent-${name}`, '  data_dir: DATA_DIR', '  log: { format: json }', 'app_service:', '  enabled: yes', '  apps:', `    - { name: keeper, uri: "tcp://127.0.0.1:${app.port}" }`, ''].join('\n'), {
    args: ['--token', token, '--ca-pin', pin, '--proxy', `${PROXY_NAME}:${webPort}`],
    env: { HTTPS_PROXY: squid.url },
  });
  gateways.push(agent);
  await agent.waitForLog('reverse tunnel ready', 30_000);
  const userEnv = { HOME: home, GWSH_HOME: join(home, 'alice') };
  const login = await runCli('gwsh', ['login', `--proxy=${PROXY_IP}:${webPort}`, '--user=alice', `--ca-pin=${pin}`], { env: userEnv, input: `${PASSWORD}\n` });
  expect(login.status, login.stderr).toBe(0);
  return { proxy, agent, userEnv, webPort, gwctl: async (args) => (await admin(args)).stdout };
}

/** `gwsh --debug proxy app keeper --e2e MODE`: its port and what it printed. */
async function gwshProxy(c: Cluster, mode: string): Promise<{ port: number; output: () => string }> {
  const child = spawn(process.execPath, [BIN('gwsh'), '--debug', 'proxy', 'app', 'keeper', '--port', '0', '--e2e', mode], { env: { PATH: process.env.PATH ?? '', ...c.userEnv } });
  children.push(child);
  let output = '';
  child.stdout.on('data', (d: Buffer) => (output += d.toString()));
  child.stderr.on('data', (d: Buffer) => (output += d.toString()));
  await waitUntil(`gwsh proxy app (${mode}) to listen`, () => /127\.0\.0\.1:(\d+)/.test(output) || child.exitCode !== null, 30_000);
  return { port: Number(/127\.0\.0\.1:(\d+)/.exec(output)![1]), output: () => output };
}

/** Sends `bytes` through gwsh's local port and collects the echo until it is whole or the connection ends. */
async function roundTrip(port: number, bytes: Buffer): Promise<{ echoed: Buffer; how: 'whole' | 'ended' | 'error' }> {
  const socket = net.connect(port, '127.0.0.1');
  const got: Buffer[] = [];
  let have = 0;
  return new Promise((resolve) => {
    const done = (how: 'whole' | 'ended' | 'error') => {
      socket.destroy();
      resolve({ echoed: Buffer.concat(got), how });
    };
    socket.on('data', (c: Buffer) => {
      got.push(c);
      have += c.length;
      if (have >= bytes.length) done('whole');
    });
    socket.once('error', () => done('error'));
    socket.once('end', () => done('ended'));
    socket.write(bytes);
  });
}

/** A payload whose every 64 bytes carry the marker, so that any 64-byte window of it that a recorder kept shows it. */
function marked(marker: string, size: number): Buffer {
  const unit = Buffer.from(marker.padEnd(64, '.'));
  return Buffer.concat(Array.from({ length: Math.ceil(size / 64) }, () => unit)).subarray(0, size);
}

async function recorded(recordDir: string): Promise<Array<{ name: string; bytes: Buffer }>> {
  return Promise.all((await readdir(recordDir)).sort().map(async (name) => ({ name, bytes: await readFile(join(recordDir, name)) })));
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-streams-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${PROXY_IP} ${PROXY_NAME}\n`, { mode: 0o644 });
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  app = await keepingEcho();
}, 60_000);

afterAll(async () => {
  for (const c of children) c.kill('SIGKILL');
  for (const g of gateways) await g.stop().catch(() => undefined);
  await squid?.stop();
  await app?.close();
  await rm(dir, { recursive: true, force: true });
});

describe('a Proxy that records everything it relays', () => {
  let c: Cluster;
  const recordDir = () => join(dir, 'record');

  beforeAll(async () => {
    await mkdir(recordDir(), { recursive: true });
    c = await cluster('rec', { GW_TEST_RECORD: recordDir() });
  }, 120_000);

  it("an end-to-end stream: whole at both ends, and not one marker in anything the Proxy held; the classic route's marker is there", async () => {
    const e2e = await gwshProxy(c, 'require');
    const secret = `E2E-SECRET-${randomBytes(12).toString('hex')}`;
    const bytes = marked(secret, 256 * 1024);
    const r = await roundTrip(e2e.port, bytes);
    expect(r.how, e2e.output()).toBe('whole');
    expect(r.echoed.equals(bytes)).toBe(true);
    expect(e2e.output()).toMatch(new RegExp(`gwsh: keeper: end-to-end to agent ${c.agent.hostId}`));
    const held = await recorded(recordDir());
    expect(held.length).toBeGreaterThan(0);
    expect(held.filter((f) => f.bytes.includes(secret)).map((f) => f.name)).toEqual([]);

    // The same recorder on the classic route: the Proxy decrypts the client's TLS, and the marker is in what it held.
    const classic = await gwshProxy(c, 'off');
    const plain = `CLASSIC-SECRET-${randomBytes(12).toString('hex')}`;
    const r2 = await roundTrip(classic.port, marked(plain, 64 * 1024));
    expect(r2.how).toBe('whole');
    expect((await recorded(recordDir())).some((f) => f.name.endsWith('-tls.bin') && f.bytes.includes(plain))).toBe(true);
  }, 60_000);

  it('replay: the raw bytes of a used end-to-end connection, sent to the Proxy again, are refused (access_denied), reaching no agent', async () => {
    const e2eRaw = (await recorded(recordDir())).filter((f) => f.name.endsWith('-raw.bin') && f.bytes.includes('.e2e.gateway.invalid'));
    expect(e2eRaw.length).toBeGreaterThan(0);
    const before = app.received.length;
    const replayed = e2eRaw[0]!.bytes;
    const answer = await new Promise<Buffer>((resolve) => {
      const got: Buffer[] = [];
      const s = net.connect({ host: PROXY_IP, port: c.webPort }, () => s.write(replayed));
      s.on('data', (d: Buffer) => got.push(d));
      s.on('error', () => undefined);
      s.on('close', () => resolve(Buffer.concat(got)));
    });
    // A TLS alert record: fatal (2), access_denied (49).
    expect([...answer.subarray(0, 7)]).toEqual([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31]);
    expect(app.received.length).toBe(before);
  }, 30_000);

  it('both ends audit the session: the Proxy its route and bytes, the agent the grant it checked', async () => {
    await waitUntil('the end of both sessions in the audit log', async () => {
      const events = JSON.parse(await c.gwctl(['get', 'events', '-f', 'json'])) as Array<{ spec: Record<string, unknown> }>;
      return events.filter((e) => e.spec.event === 'app.session.end' && e.spec.e2e === true).length >= 2;
    }, 30_000);
    const events = (JSON.parse(await c.gwctl(['get', 'events', '-f', 'json'])) as Array<{ spec: Record<string, unknown> }>).map((e) => e.spec).filter((e) => e.e2e === true);
    const starts = events.filter((e) => e.event === 'app.session.start');
    expect(starts.some((e) => typeof e.grant === 'string' && e.user === 'alice' && e.resource === 'keeper')).toBe(true);
    expect(starts.some((e) => e.grant === undefined && e.user === 'alice' && e.resource === 'keeper')).toBe(true);
  }, 60_000);
});

describe('a Proxy that alters a byte of a relayed stream', () => {
  it('the stream breaks at the client, and the app never receives an altered byte', async () => {
    const c = await cluster('alter', { GW_TEST_ALTER_AFTER: String(ALTER_AT) });
    const e2e = await gwshProxy(c, 'require');
    const before = app.received.length;
    const bytes = randomBytes(256 * 1024);
    const r = await roundTrip(e2e.port, bytes);
    expect(r.how, e2e.output()).not.toBe('whole');
    // What the app got is a prefix of what was sent, however far it got: never a changed byte.
    for (const conn of app.received.slice(before)) {
      const got = Buffer.concat(conn);
      expect(got.equals(bytes.subarray(0, got.length))).toBe(true);
    }
    expect(Buffer.concat(app.received.slice(before).flat()).length).toBeLessThan(bytes.length);
  }, 120_000);
});

