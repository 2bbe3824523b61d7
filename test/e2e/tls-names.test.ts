/**
 * A Proxy reached by an address its certificate does not hold (behind a load balancer, the seed's first reason
 * for public_addr), with the right CA pin: gwsh login and an agent join fail with GW_ERR_TLS_NAME_MISMATCH naming
 * the address dialled and the certificate's names, not with "pass --ca-pin". Then the test does what the hint
 * says (public_addr on the Proxy, restart) and the very same commands succeed.
 *
 * The "load balancer" is a TCP forwarder on another loopback address; the name test goes through squid, the only
 * resolver of lb.gw.test.
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startGateway, startGatewayExpectingFailure, type RunningGateway } from '../helpers/gateway.js';
import { startSquid, type Squid } from '../helpers/squid.js';

const PROXY_IP = '127.0.0.11';
const LB_IP = '127.0.0.12';
const LB_NAME = 'lb.gw.test';
const PASSWORD = 'correct horse battery';

let dir: string;
let dataDir: string;
let squid: Squid;
let lb: net.Server;
const lbSockets = new Set<net.Socket>();
let webPort: number;
let lbAddr: string;
let lbNameAddr: string;
let cluster: RunningGateway | undefined;
let pin: string;
let token: string;

const clusterConfig = (publicAddrs: string[]) =>
  [
    'gateway:',
    '  nodename: auth-1',
    `  data_dir: ${dataDir}`,
    '  log: { format: json }',
    'auth_service:',
    '  cluster_name: tls.example',
    '  listen_addr: 127.0.0.1:0',
    'proxy_service:',
    `  web_listen_addr: ${PROXY_IP}:${webPort}`,
    `  public_addr: [${publicAddrs.map((a) => `"${a}"`).join(', ')}]`,
    '',
  ].join('\n');
const agentConfig = ['gateway:', '  nodename: node-lb', '  data_dir: DATA_DIR', '  log: { format: json }', 'ssh_service:', '  enabled: yes', ''].join('\n');
const admin = (args: string[], input?: string) => runCli('gwctl', ['--data-dir', dataDir, ...args], { env: { HOME: dir }, ...(input === undefined ? {} : { input }) });
const login = (proxy: string, home: string, env: Record<string, string> = {}, withPin = true) =>
  runCli('gwsh', ['login', `--proxy=${proxy}`, '--user=alice', ...(withPin ? [`--ca-pin=${pin}`] : [])], { env: { HOME: dir, GWSH_HOME: join(dir, home), ...env }, input: `${PASSWORD}\n` });

/** The address the hint tells the operator to add to proxy_service.public_addr. */
function addressFromHint(stderr: string): string {
  const m = /^hint: Set proxy_service\.public_addr on the Proxy to include (\S+) and restart the Proxy/m.exec(stderr);
  expect(m, stderr).not.toBeNull();
  return m![1]!;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-tls-'));
  await chmod(dir, 0o755);
  dataDir = join(dir, 'cluster-data');
  webPort = await getPort({ host: PROXY_IP });
  // The load balancer: every connection to LB_IP is passed to the Proxy.
  lb = net.createServer((client) => {
    const upstream = net.connect({ host: PROXY_IP, port: webPort });
    lbSockets.add(client).add(upstream);
    client.once('close', () => lbSockets.delete(client));
    upstream.once('close', () => lbSockets.delete(upstream));
    client.pipe(upstream).pipe(client);
    client.on('error', () => upstream.destroy());
    upstream.on('error', () => client.destroy());
  });
  await new Promise<void>((resolve) => lb.listen(0, LB_IP, resolve));
  const lbPort = (lb.address() as net.AddressInfo).port;
  lbAddr = `${LB_IP}:${lbPort}`;
  lbNameAddr = `${LB_NAME}:${lbPort}`;
  await writeFile(join(dir, 'hosts'), `${LB_IP} ${LB_NAME}\n`, { mode: 0o644 });
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  cluster = await startGateway(clusterConfig([`${PROXY_IP}:${webPort}`]));
  pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec((await admin(['status'])).stdout)![1]!;
  expect((await admin(['users', 'add', 'alice', '--roles=access'], `${PASSWORD}\n`)).status).toBe(0);
  token = (JSON.parse((await admin(['tokens', 'add', '--type=node', '--format', 'json'])).stdout) as { token: string }).token;
}, 90_000);

afterAll(async () => {
  await cluster?.stop();
  await squid?.stop();
  for (const socket of lbSockets) socket.destroy();
  await new Promise<void>((resolve) => (lb ? lb.close(() => resolve()) : resolve()));
  await rm(dir, { recursive: true, force: true });
});

describe('dialled by an address the certificate does not hold, with the right pin', () => {
  it('gwsh login by IP: GW_ERR_TLS_NAME_MISMATCH naming the address and the names, and the public_addr fix', async () => {
    const r = await login(lbAddr, 'by-ip');
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_TLS_NAME_MISMATCH');
    expect(r.stderr).toMatch(new RegExp(`^error: the certificate of ${lbAddr} does not hold the IP address ${LB_IP} that was dialled`, 'm'));
    for (const name of ['auth-1', 'localhost', '127.0.0.1', '::1', PROXY_IP]) expect(r.stderr).toContain(name);
    expect(addressFromHint(r.stderr)).toBe(lbAddr);
    expect(r.stderr).not.toContain('Pass the cluster');
  });

  it('gwsh login by a name, through squid: the same, with the name', async () => {
    const r = await login(lbNameAddr, 'by-name', { HTTPS_PROXY: squid.url });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_TLS_NAME_MISMATCH');
    expect(r.stderr).toContain(`the certificate of ${lbNameAddr} does not hold the name ${LB_NAME}`);
    expect(addressFromHint(r.stderr)).toBe(lbNameAddr);
  });

  it('an agent join: the same error, and the token is not spent', async () => {
    const r = await startGatewayExpectingFailure(agentConfig, ['--token', token, '--ca-pin', pin, '--proxy', lbAddr]);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('GW_ERR_TLS_NAME_MISMATCH');
    expect(r.stderr).toContain(`the certificate of ${lbAddr} does not hold the IP address ${LB_IP}`);
    expect(addressFromHint(r.stderr)).toBe(lbAddr);
    const tokens = JSON.parse((await admin(['tokens', 'ls', '--format', 'json'])).stdout) as Array<{ used: number }>;
    expect(tokens.map((t) => t.used)).toEqual([0]);
  });
});

describe('after following the hint', () => {
  beforeAll(async () => {
    // What the hints said: add the addresses to proxy_service.public_addr and restart the Proxy.
    await cluster!.stop();
    cluster = undefined;
    cluster = await startGateway(clusterConfig([`${PROXY_IP}:${webPort}`, lbAddr, lbNameAddr]));
  }, 60_000);

  it('the same gwsh logins succeed, by IP and by name', async () => {
    const byIp = await login(lbAddr, 'by-ip');
    expect(byIp.stderr).toBe('');
    expect(byIp.status).toBe(0);
    const byName = await login(lbNameAddr, 'by-name', { HTTPS_PROXY: squid.url });
    expect(byName.stderr).toBe('');
    expect(byName.status).toBe(0);
  });

  it('the same agent join succeeds', async () => {
    const agent = await startGateway(agentConfig, { args: ['--token', token, '--ca-pin', pin, '--proxy', lbAddr] });
    try {
      expect(agent.hostId).toMatch(/^[0-9a-f-]{36}$/);
      await agent.waitForLog('reverse tunnel ready');
    } finally {
      await agent.stop();
    }
  });

  it('without a pin (and no CA kept from before), the error is the untrusted CA and its hint the pin, which then works', async () => {
    const r = await login(lbAddr, 'no-pin', {}, false);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_CLIENT_UNTRUSTED');
    expect(r.stderr).toMatch(/^hint: Pass the cluster's CA pin with --ca-pin/m);
    expect((await login(lbAddr, 'no-pin')).status).toBe(0);
  });
});
