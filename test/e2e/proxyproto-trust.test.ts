/**
 * A PROXY header is believed only from the load balancers the operator lists
 * (`proxy_service.proxy_protocol_trusted_sources`), with the real daemon, a real HAProxy (`send-proxy-v2`) and
 * the login route. Issue 23 saw, against `proxy_protocol: on`: 80 password checks instead of 5 from one real
 * address (each attempt under a made-up source), 80 made-up sources in the audit log, and a chosen victim
 * address locked out. Here an attacker at an unlisted loopback address does the same, and is closed before TLS;
 * the balancer, at a listed address, still carries clients and the Proxy counts and audits them under their own
 * addresses.
 *
 * Loopback addresses stand for the machines: the Proxy listens on 127.0.0.61, HAProxy takes clients on
 * 127.0.0.62 and connects to the Proxy from 127.0.0.63 (its `source`; the one listed address); the attacker
 * connects straight to the Proxy from 127.0.0.64; clients behind the balancer come from 127.0.0.65-67.
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import https from 'node:https';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateKeyPair } from '../../src/auth/pki.js';
import { buildProxyHeaderV1, buildProxyHeaderV2 } from '../../src/mux/proxyproto.js';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { startBalancer, type Balancer } from '../helpers/haproxy.js';
import { eventually } from '../helpers/wait.js';

const PROXY_IP = '127.0.0.61';
const LB_IP = '127.0.0.62';
const LB_SOURCE = '127.0.0.63';
const ATTACKER = '127.0.0.64';
const VICTIM = '127.0.0.65';
const GUESSER = '127.0.0.66';
const ALICE_ELSEWHERE = '127.0.0.67';
const PROXY_NAME = 'proxy.gw.test';
const PASSWORD = 'correct horse battery';

let dir: string;
let gw: RunningGateway;
let balancer: Balancer;
let webPort: number;
let lbPort: number;
const keys = generateKeyPair();

/** The daemon's configuration with these trusted sources (DATA_DIR: startGateway's placeholder). */
function configWith(trusted: readonly string[]): string {
  return [
    'gateway:',
    '  nodename: proxy-1',
    '  data_dir: DATA_DIR',
    '  log: { format: json, severity: debug }',
    'auth_service:',
    '  cluster_name: pptrust.example',
    '  listen_addr: 127.0.0.1:0',
    'proxy_service:',
    `  web_listen_addr: ${PROXY_IP}:${webPort}`,
    `  public_addr: ${PROXY_NAME}:${webPort}`,
    '  proxy_protocol: on',
    `  proxy_protocol_trusted_sources: [${trusted.map((t) => JSON.stringify(t)).join(', ')}]`,
    '',
  ].join('\n');
}

const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', gw.dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-pptrust-'));
  await chmod(dir, 0o755);
  webPort = await getPort({ host: PROXY_IP });
  lbPort = await getPort({ host: LB_IP });
  gw = await startGateway(configWith([LB_SOURCE, '2001:db8::/32']));
  const added = await gwctl(['users', 'add', 'alice', '--roles=access'], `${PASSWORD}\n`);
  expect(added.stderr).toBe('');
  balancer = await startBalancer({ dir, bind: { host: LB_IP, port: lbPort }, servers: { proxy: `${PROXY_IP}:${webPort}` }, sendProxyV2: true, source: LB_SOURCE });
  // The balancer carries a client once its check has found the Proxy up.
  await eventually('a ping through the balancer', async () => {
    const r = await login({ via: 'balancer', from: VICTIM, password: 'not a login, a probe', username: 'probe-nobody' });
    if (statusOf(r) !== 401) throw new Error(`answered ${JSON.stringify(r)}`);
  });
}, 90_000);

afterAll(async () => {
  await balancer?.stop();
  await gw?.stop();
  await rm(dir, { recursive: true, force: true });
});

type Answer = { status: number; code?: string } | { error: string };

/**
 * POST /webapi/login for `username` from the loopback address `from`: through the balancer, or straight to the
 * Proxy with a PROXY header naming `claim` first (v1 or v2), as an attacker who can reach the Proxy would.
 */
/** claim: send a PROXY header naming this address first (through the balancer too: then it is a second header). */
type Via = { via: 'balancer'; claim?: string; header?: 1 | 2 } | { via: 'direct'; claim: string; header?: 1 | 2 };

function login(o: Via & { from: string; password: string; username?: string }): Promise<Answer> {
  const body = JSON.stringify({ username: o.username ?? 'alice', password: o.password, public_key: keys.publicKeyPem, ssh_public_key: keys.sshPublicKey });
  const target = o.via === 'balancer' ? { host: LB_IP, port: lbPort } : { host: PROXY_IP, port: webPort };
  return new Promise((resolve) => {
    const raw = net.connect({ ...target, localAddress: o.from });
    raw.on('error', () => undefined);
    if (o.claim !== undefined) {
      const src = { address: o.claim, port: 40_000 };
      const dst = { address: PROXY_IP, port: webPort };
      raw.write(o.header === 2 ? buildProxyHeaderV2({ command: 'PROXY', family: 'tcp4', source: src, destination: dst }) : buildProxyHeaderV1({ family: 'tcp4', source: src, destination: dst }));
    }
    const req = https.request(
      {
        createConnection: () => tls.connect({ socket: raw, servername: PROXY_NAME, rejectUnauthorized: false }),
        path: '/webapi/login',
        method: 'POST',
        headers: { host: `${PROXY_NAME}:${webPort}`, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
      },
      (res) => {
        let data = '';
        res.on('data', (c: Buffer) => (data += c.toString()));
        res.on('end', () => {
          let code: string | undefined;
          try {
            code = (JSON.parse(data) as { error?: { code?: string } }).error?.code;
          } catch {
            code = undefined;
          }
          resolve({ status: res.statusCode ?? 0, ...(code ? { code } : {}) });
        });
      },
    );
    req.on('error', (err: NodeJS.ErrnoException) => resolve({ error: err.code ?? err.message }));
    req.end(body);
  });
}

const statusOf = (a: Answer): number | undefined => ('status' in a ? a.status : undefined);

interface AuditEvent {
  event: string;
  user?: string;
  source?: string;
}

async function loginEvents(): Promise<AuditEvent[]> {
  const r = await gwctl(['get', 'events', '--format', 'json']);
  expect(r.status).toBe(0);
  return (JSON.parse(r.stdout) as Array<{ spec: AuditEvent }>).map((e) => e.spec).filter((e) => e.event.startsWith('user.login'));
}

describe('an attacker that reaches the Proxy directly, with a PROXY header', () => {
  it('80 logins, each under a made-up source: none is checked, none reaches the audit log, each is closed, counted and logged under the real address', async () => {
    const answers = await Promise.all(
      Array.from({ length: 80 }, (_, i) => login({ via: 'direct', claim: `203.0.113.${i + 1}`, header: i % 2 === 0 ? 1 : 2, from: ATTACKER, password: `guess ${i}` })),
    );
    // Before the fix: 80 answers 401 GW_ERR_AUTH_LOGIN_FAILED (one password check per made-up source).
    expect(answers.filter((a) => statusOf(a) !== undefined)).toEqual([]);
    expect(answers.every((a) => 'error' in a)).toBe(true);
    const events = await loginEvents();
    expect(events.filter((e) => e.source?.startsWith('203.0.113.'))).toEqual([]);
    expect(events.filter((e) => e.source === ATTACKER)).toEqual([]);
    // Counted and logged under the attacker's own address, at warn, with the code; the made-up ones appear nowhere.
    const line = await gw.waitForLog("GW_ERR_MUX_PROXY_HEADER_UNTRUSTED");
    expect(JSON.parse(line)).toMatchObject({ level: 40, msg: 'connection refused', reason: 'proxy-protocol-untrusted-source' });
    // Every such line names the attacker's own address (none an unknown peer: the balancer's health checks, which
    // reset right after their header, are not refusals of an untrusted source).
    const refusals = gw.logs().split('\n').filter((l) => l.includes('GW_ERR_MUX_PROXY_HEADER_UNTRUSTED')).map((l) => JSON.parse(l) as { client: string });
    expect(refusals.length).toBeGreaterThan(0);
    for (const r of refusals) expect(r.client).toMatch(/^127\.0\.0\.64:\d+$/);
    expect(gw.logs()).not.toContain('203.0.113.');
  }, 120_000);

  it("a victim's address named in 10 headers with wrong passwords: the victim, behind the balancer, still signs in", async () => {
    const spoofed = await Promise.all(Array.from({ length: 10 }, (_, i) => login({ via: 'direct', claim: VICTIM, from: ATTACKER, password: `wrong ${i}` })));
    // Before the fix: 5 answers 401 then 429, and the victim's own login below is 429 GW_ERR_AUTH_RATE_LIMITED.
    expect(spoofed.every((a) => 'error' in a)).toBe(true);
    const own = await login({ via: 'balancer', from: VICTIM, password: PASSWORD });
    expect(own).toEqual({ status: 200 });
  }, 60_000);

  it('without a header the attacker is an ordinary client under its own address', async () => {
    const r = await new Promise<number>((resolve, reject) => {
      https
        .get({ host: PROXY_IP, port: webPort, localAddress: ATTACKER, servername: PROXY_NAME, path: '/webapi/ping', rejectUnauthorized: false, agent: false }, (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        })
        .on('error', reject);
    });
    expect(r).toBe(200);
  });
});

describe('HAProxy at the listed address (send-proxy-v2)', () => {
  it("the client's own address is what the audit log and the rate limit see, not the balancer's", async () => {
    const answers: Answer[] = [];
    for (let i = 0; i < 8; i++) answers.push(await login({ via: 'balancer', from: GUESSER, password: `wrong ${i}` }));
    const checked = answers.filter((a) => statusOf(a) === 401).length;
    expect(checked).toBeGreaterThan(0);
    expect(checked).toBeLessThanOrEqual(5);
    expect(answers.filter((a) => statusOf(a) === 429).length).toBe(8 - checked);
    const failures = (await loginEvents()).filter((e) => e.event === 'user.login.failure' && e.user === 'alice');
    expect(failures.filter((e) => e.source === GUESSER).length).toBe(checked);
    expect(failures.filter((e) => e.source === LB_SOURCE)).toEqual([]);
    // The lockout is the guesser's: alice behind the same balancer, from her own address, signs in.
    expect(await login({ via: 'balancer', from: ALICE_ELSEWHERE, password: PASSWORD })).toEqual({ status: 200 });
    const ok = (await loginEvents()).filter((e) => e.event === 'user.login' && e.user === 'alice');
    expect(ok.map((e) => e.source)).toEqual(expect.arrayContaining([VICTIM, ALICE_ELSEWHERE]));
  }, 60_000);

  it("a client behind the balancer that sends its own header naming a victim: a second header, closed; the victim's limit is untouched", async () => {
    const before = (await loginEvents()).length;
    const answers = await Promise.all(Array.from({ length: 10 }, (_, i) => login({ via: 'balancer', claim: VICTIM, header: i % 2 === 0 ? 1 : 2, from: GUESSER, password: `wrong ${i}` })));
    expect(answers.every((a) => 'error' in a)).toBe(true);
    expect((await loginEvents()).length).toBe(before);
    const line = JSON.parse(await gw.waitForLog('"proxy-protocol-twice"')) as { client: string };
    // The connection's client was already the guesser (from HAProxy's header) when the second one came.
    expect(line.client).toMatch(/^127\.0\.0\.66:\d+$/);
    expect(await login({ via: 'balancer', from: VICTIM, password: PASSWORD })).toEqual({ status: 200 });
  }, 60_000);

  it('the start says nothing about trusting any source (a list is set)', () => {
    // (Checked before the SIGHUP tests below empty the list.)
    expect(gw.logs()).not.toContain('believed from any source');
    expect(gw.logs()).not.toContain('believed from ANY source');
  });
});

describe('SIGHUP with a new list', () => {
  /** Rewrites the configuration, sends SIGHUP and resolves with the n-th "configuration reloaded" line. */
  async function reloadWith(trusted: readonly string[], n: number): Promise<{ applied: string[]; restart_needed: string[] }> {
    await writeFile(gw.configPath, configWith(trusted).replaceAll('DATA_DIR', gw.dataDir));
    gw.process.kill('SIGHUP');
    let line: { applied: string[]; restart_needed: string[] } | undefined;
    await eventually(`reload #${n}`, async () => {
      const lines = gw.logs().split('\n').filter((l) => l.includes('"configuration reloaded'));
      if (lines.length < n) throw new Error(`${lines.length} reloads`);
      line = JSON.parse(lines[n - 1]!) as { applied: string[]; restart_needed: string[] };
    });
    return line!;
  }

  it('the balancer taken out of the list: its headers are refused at once, without a restart; put back, it carries clients again', async () => {
    expect(await reloadWith(['2001:db8::/32'], 1)).toMatchObject({ applied: ['proxy_service.proxy_protocol_trusted_sources'], restart_needed: [] });
    const out = await login({ via: 'balancer', from: ALICE_ELSEWHERE, password: PASSWORD });
    expect('error' in out).toBe(true);
    expect(await reloadWith([LB_SOURCE, '2001:db8::/32'], 2)).toMatchObject({ applied: ['proxy_service.proxy_protocol_trusted_sources'] });
    expect(await login({ via: 'balancer', from: ALICE_ELSEWHERE, password: PASSWORD })).toEqual({ status: 200 });
  }, 60_000);

  it('an empty list: the warning is logged again', async () => {
    await reloadWith([], 3);
    const warning = JSON.parse(await gw.waitForLog('believed from any source')) as { level: number };
    expect(warning.level).toBe(40);
  }, 60_000);
});

