/**
 * An agent behind a proxy that asks for Digest: the real binaries, a real squid (digest_file_auth) and a firewall.
 *
 * Topology (test/helpers/firewall.ts, as in tunnel.test.ts): the agent and its app (a TCP echo) run in one network
 * namespace, the Proxy in another, and the root namespace does not forward: the agent's only way out is squid in
 * the root namespace, which asks every CONNECT for credentials and offers Digest and Basic. The agent is given
 * HTTPS_PROXY=http://alice:<password>@squid; it must answer with Digest (squid's auth log shows the scheme of every
 * request), its tunnel comes up, squid's access log shows alice, and a client's byte stream goes through
 * `gwsh proxy app` byte-exact. The agent's own log carries no password and no Proxy-Authorization value.
 */
import { createHash, randomBytes } from 'node:crypto';
import type { ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { runCleanup } from '../helpers/cleanup.js';
import { createFirewall, startGatewayIn, type Firewall, type NsGateway } from '../helpers/firewall.js';
import { runCli } from '../helpers/gateway.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';
import { rootSuite } from '../helpers/root.js';
import { parseAccessLogLine, startSquid, type Squid } from '../helpers/squid.js';

const describeAsRoot = rootSuite(['netns', 'port443']);

const PROXY_NAME = 'proxy.gw.test';
const WEB_PORT = 443;
const PASSWORD = 'correct horse battery';
const SQUID_PASSWORD = `Dig:est"${randomBytes(4).toString('hex')}@pw`;
const APP_PORT = 7100;

const ECHO_SOURCE = `require('net').createServer((s) => { s.on('error', () => {}); s.pipe(s); }).listen(${APP_PORT}, '127.0.0.1', () => console.log('"listening"'));`;

let fw: Firewall;
let dir: string;
let squid: Squid;
let proxy: NsGateway;
let agent: NsGateway | undefined;
let echoApp: ChildProcess | undefined;
let aliceEnv: Record<string, string>;
const children: ChildProcess[] = [];

const gwctl = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', proxy.dataDir, ...args], { env: { HOME: dir }, ...(input ? { input } : {}) });

beforeAll(async () => {
  fw = await createFirewall();
  dir = await mkdtemp(join(tmpdir(), 'gw-proxyauth-e2e-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${fw.proxyIp} ${PROXY_NAME}\n`, { mode: 0o644 });
  squid = await startSquid({
    host: fw.agentGatewayIp,
    auth: { user: 'alice', password: SQUID_PASSWORD, schemes: ['basic', 'digest'] },
    logAuthScheme: true,
    // The agent's address may use this squid, once authenticated.
    extraConfig: [`hosts_file ${join(dir, 'hosts')}`, `acl agent_net src ${fw.agentIp}/32`, 'http_access deny !authenticated', 'http_access allow agent_net'],
  });
  const proxyConfig = ['gateway:', '  nodename: proxy-1', '  data_dir: DATA_DIR', '  log: { format: json }', 'auth_service:', '  cluster_name: auth.example', `  listen_addr: ${fw.proxyIp}:3025`, 'proxy_service:', `  web_listen_addr: ${fw.proxyIp}:${WEB_PORT}`, `  public_addr: ${PROXY_NAME}:${WEB_PORT}`, ''].join('\n');
  proxy = await startGatewayIn(fw, fw.proxyNs, proxyConfig, { name: 'proxy' });
  echoApp = fw.spawnIn(fw.agentNs, process.execPath, ['-e', ECHO_SOURCE]);
  await new Promise<void>((resolve, reject) => {
    echoApp!.stdout!.on('data', (c: Buffer) => c.toString().includes('"listening"') && resolve());
    echoApp!.once('exit', (code) => reject(new Error(`the echo app exited with ${code}`)));
  });

  const status = await gwctl(['status']);
  const pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec(status.stdout)![1]!;
  expect((await gwctl(['users', 'add', 'alice', '--roles=access'], `${PASSWORD}\n`)).status).toBe(0);
  const tokens = await gwctl(['tokens', 'add', '--type=app', '--ttl=10m', '--format', 'json']);
  const token = (JSON.parse(tokens.stdout) as { token: string }).token;
  const agentConfig = ['gateway:', '  nodename: agent-1', '  data_dir: DATA_DIR', '  log: { format: json, severity: debug }', 'app_service:', '  enabled: yes', '  apps:', `    - { name: echo, uri: tcp://127.0.0.1:${APP_PORT} }`, ''].join('\n');
  const proxyUrl = `http://alice:${encodeURIComponent(SQUID_PASSWORD)}@${squid.host}:${squid.port}`;
  agent = await startGatewayIn(fw, fw.agentNs, agentConfig, { name: 'agent', args: ['--token', token, '--ca-pin', pin, '--proxy', `${PROXY_NAME}:${WEB_PORT}`], env: { HTTPS_PROXY: proxyUrl } });
  await agent.waitForLog('reverse tunnel ready', 30_000);

  aliceEnv = { HOME: dir, GWSH_HOME: join(dir, 'alice-gwsh') };
  const login = await runCli('gwsh', ['login', `--proxy=${fw.proxyIp}:${WEB_PORT}`, '--user=alice', `--ca-pin=${pin}`], { env: aliceEnv, input: `${PASSWORD}\n` });
  expect(login.stderr).toBe('');
}, 120_000);

afterAll(async () => {
  await runCleanup([
    () => children.forEach((c) => c.kill('SIGTERM')),
    () => agent?.stop(true),
    () => proxy?.stop(true),
    () => echoApp?.kill('SIGKILL'),
    () => squid?.stop(),
    () => fw?.close(),
    () => dir && rm(dir, { recursive: true, force: true }),
  ]);
}, 60_000);

describeAsRoot('an agent behind a proxy that asks for Digest (or Basic)', () => {
  it('cannot reach the Proxy but through squid', async () => {
    expect((await fw.tcpConnectFrom(fw.agentNs, fw.proxyIp, WEB_PORT, 3000)).ok).toBe(false);
  });

  it("joined and opened its tunnel with Digest: squid's access log shows alice, its auth log Digest and never Basic", async () => {
    const at = `${PROXY_NAME}:${WEB_PORT}`;
    await squid.waitForAccessLog((l) => {
      const e = parseAccessLogLine(l);
      return e.client === fw.agentIp && e.url === at && e.status === 200 && e.user === 'alice';
    }, 20_000);
    const auth = (await squid.readAuthLog()).filter((l) => l.startsWith(`CONNECT ${at} `));
    expect(auth).toContain(`CONNECT ${at} 407 -`);
    expect(auth).toContain(`CONNECT ${at} 200 Digest`);
    expect(auth.filter((l) => l.endsWith(' Basic'))).toEqual([]);
  });

  it('a byte stream goes through gwsh proxy app, byte-exact', async () => {
    const gp = await startGwshProxy(['app', 'echo', '--e2e', 'require'], aliceEnv, children);
    const payload = randomBytes(4 * 1024 * 1024);
    const socket = net.connect(gp.port, '127.0.0.1');
    const received: Buffer[] = [];
    let got = 0;
    await new Promise<void>((resolve, reject) => {
      socket.on('data', (c: Buffer) => {
        received.push(c);
        got += c.length;
        if (got >= payload.length) resolve();
      });
      socket.once('error', reject);
      socket.write(payload);
    });
    socket.destroy();
    const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
    expect(sha(Buffer.concat(received))).toBe(sha(payload));
  });

  it("the agent's log has no password and no Proxy-Authorization value", () => {
    const logs = agent!.logs();
    expect(logs).toContain('answering the proxy');
    expect(logs).not.toContain(SQUID_PASSWORD);
    expect(logs).not.toContain(encodeURIComponent(SQUID_PASSWORD));
    expect(logs).not.toMatch(/response=|Proxy-Authorization/i);
  });
});
