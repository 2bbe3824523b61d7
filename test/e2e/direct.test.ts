/**
 * Direct-join agents as processes: `gateway start --auth-server` against a running auth + proxy daemon. The agent
 * opens no reverse tunnel (before, it asked the Auth address for /webapi/find, got 404 and retried forever), opens
 * its SSH and Windows Desktop listeners, and is online in `gwctl get nodes` through the presence it writes
 * itself; a graceful stop removes that presence. Its SSH listener speaks mutual TLS, not SSH: a plain SSH client
 * (which would skip the Proxy's locks and roles) gets no SSH server. What the Proxy does with those listeners is
 * tested in test/agent/direct.test.ts.
 *
 * Everything listens on this machine's first non-loopback IPv4 address: the Auth Service refuses loopback
 * listener addresses in a presence (the Proxy would dial itself).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import { networkInterfaces, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli, startGateway, type RunningGateway } from '../helpers/gateway.js';
import { waitUntil } from '../helpers/wait.js';

/** A non-loopback address of this machine: where the agent and the Auth Service listen. */
const HOST_IP = Object.values(networkInterfaces())
  .flat()
  .find((i) => i && i.family === 'IPv4' && !i.internal)?.address;

let dir: string;
let cluster: RunningGateway;
let agent: RunningGateway;
let desktop: net.Server;

const gwctl = (args: string[]) => runCli('gwctl', ['--data-dir', cluster.dataDir, ...args], { env: { HOME: dir } });

async function nodeStatus(hostId: string): Promise<string | undefined> {
  const r = await gwctl(['get', 'nodes', '--format', 'json']);
  const nodes = JSON.parse(r.stdout) as Array<{ metadata: { name: string }; spec: { status: string } }>;
  return nodes.find((n) => n.metadata.name === hostId)?.spec.status;
}

beforeAll(async () => {
  if (!HOST_IP) return;
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-direct-'));
  desktop = net.createServer((s) => s.on('error', () => undefined).pipe(s)); // a relay that breaks resets it (an RST, not a FIN)
  await new Promise<void>((resolve) => desktop.listen(0, '127.0.0.1', resolve));
  cluster = await startGateway(
    ['gateway:', '  nodename: cluster-1', '  data_dir: DATA_DIR', '  log: { format: json, severity: info }', 'auth_service:', '  cluster_name: direct-e2e.example', `  listen_addr: ${HOST_IP}:0`, 'proxy_service:', '  web_listen_addr: 127.0.0.1:0', ''].join('\n'),
  );
  const pin = /CA pin:\s+(sha256:[0-9a-f]{64})/.exec((await gwctl(['status'])).stdout)![1]!;
  const token = (JSON.parse((await gwctl(['tokens', 'add', '--type=node,desktop', '--ttl=10m', '--format', 'json'])).stdout) as { token: string }).token;
  agent = await startGateway(
    [
      'gateway:',
      '  nodename: direct-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json, severity: info }',
      'ssh_service:',
      '  enabled: yes',
      `  listen_addr: ${HOST_IP}:0`,
      'windows_desktop_service:',
      '  enabled: yes',
      `  listen_addr: ${HOST_IP}:0`,
      '  desktops:',
      `    - { name: win, addr: "127.0.0.1:${(desktop.address() as net.AddressInfo).port}" }`,
      '',
    ].join('\n'),
    { args: ['--token', token, '--ca-pin', pin, '--auth-server', cluster.addresses.auth!] },
  );
}, 120_000);

afterAll(async () => {
  await agent?.stop();
  await cluster?.stop();
  desktop?.close();
  await rm(dir, { recursive: true, force: true });
}, 60_000);

// Without a non-loopback address, no listener address would be accepted by the Auth Service.
describe.skipIf(!HOST_IP)('gateway start --auth-server (a direct-join agent)', () => {
  it('opens its listeners and no tunnel, and is online through its own presence', async () => {
    expect(agent.addresses.ssh).toBe(`${HOST_IP}:${agent.addresses.ssh!.split(':')[1]}`);
    await agent.waitForLog('"listening for the Proxy (direct-join agent)"');
    await waitUntil('the node is online', async () => (await nodeStatus(agent.hostId!)) === 'online', 20_000);
    const logs = agent.logs();
    expect(logs).not.toContain('reverse tunnel');
    expect(logs).not.toContain('cannot reach the Proxy');
    expect(logs).not.toContain('/webapi/find');
  });

  it('hostile: a plain SSH client on the SSH listener gets no SSH server (mutual TLS with a Proxy first)', async () => {
    const i = agent.addresses.ssh!.lastIndexOf(':');
    const socket = net.connect(Number(agent.addresses.ssh!.slice(i + 1)), agent.addresses.ssh!.slice(0, i));
    socket.on('error', () => undefined);
    let got = '';
    socket.on('data', (c: Buffer) => (got += c.toString('latin1')));
    socket.write('SSH-2.0-OpenSSH_9.2p1\r\n');
    await new Promise((resolve) => socket.once('close', resolve));
    expect(got).not.toContain('SSH-2.0');
  });

  it('a graceful stop removes its presence: the node goes offline at once, not after the TTL', async () => {
    expect(await agent.stop()).toBe(0);
    expect(await nodeStatus(agent.hostId!)).toBe('offline');
  });
});
