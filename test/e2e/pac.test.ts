/**
 * The PAC lab: an agent whose only way out is the proxy a PAC file names.
 *
 * Topology (test/helpers/firewall.ts): the agent daemon and its app run in one network namespace, the Proxy in
 * another, and the root namespace, which joins them, does not forward packets. In the root namespace, on the
 * agent's link: a static PAC file served over HTTP (a Node server in this test), a real squid (which knows the
 * Proxy as proxy.gw.test), and a second proxy that is down (a port nothing listens on). The agent is started with
 * HTTPS_PROXY=pac+http://.../proxy.pac; the PAC answers "PROXY <down>; PROXY <squid>; DIRECT", so the agent must
 * fetch the PAC directly, pass over the dead proxy, and open its tunnel through squid. A stream then flows
 * byte-exact through `gwsh proxy app`, and squid's log shows the agent's CONNECTs. Nothing here asserts how fast
 * anything happens.
 */
import type { ChildProcess } from 'node:child_process';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startBulkServer, expectedDownloadSha256, transfer } from '../helpers/bulk.js';
import { runCleanup } from '../helpers/cleanup.js';
import { createFirewall, startGatewayIn, type Firewall, type NsGateway } from '../helpers/firewall.js';
import { BIN, runCli } from '../helpers/gateway.js';
import { startGwshProxy } from '../helpers/gwshproxy.js';
import { rootSuite } from '../helpers/root.js';
import { parseAccessLogLine, startSquid, type Squid } from '../helpers/squid.js';

const describeAsRoot = rootSuite(['netns', 'port443']);

const PROXY_NAME = 'proxy.gw.test';
const PASSWORD = 'correct horse battery';
const BULK_PORT = 7000;

let fw: Firewall;
let dir: string;
let squid: Squid;
let pacServer: http.Server | undefined;
let pacUrl: string;
let pacAnswer: string;
let pacFetches = 0;
let proxy: NsGateway;
let agent: NsGateway | undefined;
let bulkServer: ChildProcess | undefined;
let aliceEnv: Record<string, string>;
const children: ChildProcess[] = [];

const gwctl = (args: string[]) => runCli('gwctl', ['--data-dir', proxy.dataDir, ...args], { env: { HOME: dir } });

/** A port on squid's address that nothing listens on: the proxy that is down. */
async function deadPort(host: string): Promise<number> {
  const probe = net.createServer();
  await new Promise<void>((r) => probe.listen(0, host, r));
  const { port } = probe.address() as net.AddressInfo;
  await new Promise((r) => probe.close(r));
  return port;
}

describeAsRoot('an agent behind a PAC file', () => {
  beforeAll(async () => {
    fw = await createFirewall();
    dir = await mkdtemp(join(tmpdir(), 'gw-pac-e2e-'));
    await chmod(dir, 0o755);
    await writeFile(join(dir, 'hosts'), `${fw.proxyIp} ${PROXY_NAME}\n`, { mode: 0o644 });
    squid = await startSquid({
      host: fw.agentGatewayIp,
      extraConfig: [`hosts_file ${join(dir, 'hosts')}`, `acl agent_net src ${fw.agentIp}/32`, 'http_access allow agent_net'],
    });
    pacAnswer = `PROXY ${fw.agentGatewayIp}:${await deadPort(fw.agentGatewayIp)}; PROXY ${squid.host}:${squid.port}; DIRECT`;
    const pac = `// the lab's PAC\nfunction FindProxyForURL(url, host) {\n  if (dnsDomainIs(host, ".gw.test")) return "${pacAnswer}";\n  return "DIRECT";\n}\n`;
    pacServer = http.createServer((req, res) => {
      if (req.url !== '/proxy.pac') return void res.writeHead(404).end();
      pacFetches++;
      res.writeHead(200, { 'content-type': 'application/x-ns-proxy-autoconfig' }).end(pac);
    });
    await new Promise<void>((r) => pacServer!.listen(0, fw.agentGatewayIp, r));
    pacUrl = `http://${fw.agentGatewayIp}:${(pacServer.address() as net.AddressInfo).port}/proxy.pac`;

    bulkServer = await startBulkServer(dir, BULK_PORT, (command, args) => fw.spawnIn(fw.agentNs, command, args));

    const proxyConfig = [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json }',
      'auth_service:',
      '  cluster_name: pac.example',
      `  listen_addr: ${fw.proxyIp}:3025`,
      'proxy_service:',
      `  web_listen_addr: ${fw.proxyIp}:443`,
      `  public_addr: ${PROXY_NAME}:443`,
      '',
    ].join('\n');
    proxy = await startGatewayIn(fw, fw.proxyNs, proxyConfig, { name: 'proxy' });

    const status = await gwctl(['status']);
    const pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec(status.stdout)![1]!;
    expect((await runCli('gwctl', ['--data-dir', proxy.dataDir, 'users', 'add', 'alice', '--roles=access'], { env: { HOME: dir }, input: `${PASSWORD}\n` })).status).toBe(0);
    const tokens = await gwctl(['tokens', 'add', '--type=app', '--ttl=10m', '--format', 'json']);
    const token = (JSON.parse(tokens.stdout) as { token: string }).token;
    const agentConfig = [
      'gateway:',
      '  nodename: agent-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json, severity: debug }',
      'app_service:',
      '  enabled: yes',
      '  apps:',
      `    - { name: bulk, uri: tcp://127.0.0.1:${BULK_PORT} }`,
      '',
    ].join('\n');
    agent = await startGatewayIn(fw, fw.agentNs, agentConfig, {
      name: 'agent',
      args: ['--token', token, '--ca-pin', pin, '--proxy', `${PROXY_NAME}:443`],
      env: { HTTPS_PROXY: `pac+${pacUrl}` },
    });
    await agent.waitForLog('reverse tunnel ready', 30_000);

    aliceEnv = { HOME: dir, GWSH_HOME: join(dir, 'alice-gwsh') };
    const login = await runCli('gwsh', ['login', `--proxy=${fw.proxyIp}:443`, '--user=alice', `--ca-pin=${pin}`], { env: aliceEnv, input: `${PASSWORD}\n` });
    expect(login.stderr).toBe('');
  }, 120_000);

  afterAll(async () => {
    await runCleanup([
      () => children.forEach((c) => c.kill('SIGTERM')),
      () => agent?.stop(true),
      () => proxy?.stop(true),
      () => bulkServer?.kill('SIGKILL'),
      () => new Promise((r) => (pacServer ? pacServer.close(r) : r(undefined))),
      () => squid?.stop(),
      () => fw?.close(),
      () => dir && rm(dir, { recursive: true, force: true }),
    ]);
  }, 60_000);

  it('the agent cannot reach the Proxy directly: DIRECT in the answer would not work', async () => {
    const direct = await fw.tcpConnectFrom(fw.agentNs, fw.proxyIp, 443, 3000);
    expect(direct.ok).toBe(false);
  });

  it('the agent fetched the PAC, passed over the proxy that is down, and opened its tunnel through squid', async () => {
    expect(pacFetches).toBeGreaterThanOrEqual(1);
    const line = await squid.waitForAccessLog((l) => {
      const e = parseAccessLogLine(l);
      return e.client === fw.agentIp && e.method === 'CONNECT' && e.url === `${PROXY_NAME}:443` && e.status === 200;
    });
    expect(line).toContain('TCP_TUNNEL');
    // The agent's own log says why it moved on: the first entry could not be reached.
    expect(agent!.logs()).toContain('PAC entry cannot be reached; trying the next');
    expect(agent!.logs()).toContain('GW_ERR_DIAL_PROXY_UNREACHABLE');
  });

  it('a stream flows byte-exact through gwsh proxy app, over the tunnel the PAC chose', async () => {
    const local = await startGwshProxy(['app', 'bulk', '--e2e', 'require'], aliceEnv, children);
    const r = await transfer('127.0.0.1', local.port, { id: 1, upload: 4 << 20, download: 4 << 20, seed: 7, timeoutMs: 60_000 });
    expect(r.server.received.sha256).toBe(r.sent.sha256);
    expect(r.received.sha256).toBe(expectedDownloadSha256(4 << 20, 7));
  }, 90_000);

  it('gateway dial-plan in the agent namespace shows the PAC, its answer and the entry a dial starts with', async () => {
    const r = await fw.runIn(fw.agentNs, process.execPath, [BIN('gateway'), 'dial-plan', `${PROXY_NAME}:443`], { env: { HTTPS_PROXY: `pac+${pacUrl}` } });
    expect(r.status).toBe(0);
    expect(r.stdout).toContain(`PAC ${pacUrl} answers "${pacAnswer}"`);
    expect(r.stdout).toContain(`1. PROXY ${fw.agentGatewayIp}:`);
    expect(r.stdout).toMatch(/1\. PROXY [^\n]*: chosen: the first usable entry/);
  });
});
