/**
 * The Proxy's front door as a user meets it: the real daemon, curl (through a real squid), openssl s_client,
 * a real HAProxy in TCP mode with send-proxy-v2 in front, and 10 000 idle connections.
 */
import { spawn, spawnSync } from 'node:child_process';
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startGateway, type RunningGateway } from '../helpers/gateway.js';
import { separateListenKeys, separateListenLines } from '../helpers/listeners.js';
import { waitForPort } from '../helpers/netns.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { curlSync } from '../helpers/curl.js';

const PROXY_IP = '127.0.0.3';
const PROXY_NAME = 'proxy.gw.test';

let dir: string;
let squid: Squid;
let gw: RunningGateway;
let webPort: number;
let caFile: string;

function rssKb(pid: number): Promise<number> {
  return readFile(`/proc/${pid}/status`, 'utf8').then((s) => Number(/VmRSS:\s+(\d+)/.exec(s)![1]));
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-e2e-door-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${PROXY_IP} ${PROXY_NAME}\n`, { mode: 0o644 });
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  webPort = await getPort({ host: PROXY_IP });
  gw = await startGateway(
    [
      'gateway:',
      '  nodename: proxy-1',
      '  data_dir: DATA_DIR',
      '  log: { format: json, severity: debug }',
      // The 10 000 idle connections below come from one address: caps above that, so that the detection
      // deadline is what closes them (the caps have tests of their own in flood.test.ts).
      '  limits: { max_connections: 20000, max_connections_per_source: 20000 }',
      'auth_service:',
      '  cluster_name: door.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      `  web_listen_addr: ${PROXY_IP}:${webPort}`,
      `  public_addr: ${PROXY_NAME}:${webPort}`,
      '  proxy_protocol: on',
      '  detect_timeout: 2s',
      '  automatic_upgrades_channels:',
      '    stable/v14: { static_version: v14.3.7 }',
      '',
    ].join('\n'),
  );
  caFile = join(gw.dataDir, 'admin', 'host-ca.pem');
}, 60_000);

afterAll(async () => {
  await gw?.stop();
  await squid?.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('curl through squid', () => {
  const url = (path: string) => `https://${PROXY_NAME}:${webPort}${path}`;

  it('GET /webapi/ping answers the addresses clients need, with TLS routing on', async () => {
    const r = curlSync(['--cacert', caFile, url('/webapi/ping')], { HTTPS_PROXY: squid.url });
    expect(r.stderr).toBe('');
    const ping = JSON.parse(r.stdout) as { cluster_name: string; server_version: string; proxy: Record<string, unknown> };
    expect(ping.cluster_name).toBe('door.example');
    expect(ping.server_version).toBe('17.0.0-dev');
    const pub = `${PROXY_NAME}:${webPort}`;
    expect(ping.proxy).toEqual({
      kube: { enabled: true, public_addr: pub, listen_addr: `${PROXY_IP}:${webPort}` },
      ssh: { listen_addr: `${PROXY_IP}:${webPort}`, tunnel_listen_addr: `${PROXY_IP}:${webPort}`, web_listen_addr: `${PROXY_IP}:${webPort}`, public_addr: pub, ssh_public_addr: pub, ssh_tunnel_public_addr: pub },
      db: { postgres_public_addr: pub, mysql_listen_addr: `${PROXY_IP}:${webPort}`, mysql_public_addr: pub, mongo_public_addr: pub, redis_public_addr: pub },
      tls_routing_enabled: true,
    });
    await squid.waitForAccessLog((l) => l.includes(`CONNECT ${PROXY_NAME}:${webPort} 200`));
  });

  it('/webapi/find gives agents the same proxy block', () => {
    const find = JSON.parse(curlSync(['--cacert', caFile, url('/webapi/find')], { HTTPS_PROXY: squid.url }).stdout) as { proxy: unknown };
    const ping = JSON.parse(curlSync(['--cacert', caFile, url('/webapi/ping')], { HTTPS_PROXY: squid.url }).stdout) as { proxy: unknown };
    expect(find.proxy).toEqual(ping.proxy);
  });

  it('the version server answers per channel, text/plain, never cached', () => {
    const r = curlSync(['--cacert', caFile, '-i', url('/v1/webapi/automaticupgrades/channel/default/version')], { HTTPS_PROXY: squid.url });
    expect(r.stdout).toMatch(/^HTTP\/1\.1 200/);
    expect(r.stdout).toMatch(/content-type: text\/plain/i);
    expect(r.stdout).toMatch(/cache-control: no-store/i);
    expect(r.stdout.trimEnd().endsWith('v17.0.0-dev')).toBe(true);
    expect(curlSync(['--cacert', caFile, url('/v1/webapi/automaticupgrades/channel/stable/v14/version')], { HTTPS_PROXY: squid.url }).stdout).toBe('v14.3.7');
    expect(curlSync(['--cacert', caFile, url('/v1/webapi/automaticupgrades/channel/stable/v14/critical')], { HTTPS_PROXY: squid.url }).stdout).toBe('no');
    const unknown = curlSync(['--cacert', caFile, '-w', '\n%{http_code}', url('/v1/webapi/automaticupgrades/channel/nope/version')], { HTTPS_PROXY: squid.url });
    const [body, code] = unknown.stdout.split('\n');
    expect(code).toBe('404');
    expect(JSON.parse(body!)).toMatchObject({ error: { code: 'GW_ERR_VERSION_UNKNOWN_CHANNEL' } });
  });

  it('plain HTTP on the same port is redirected to HTTPS', () => {
    const r = curlSync(['-i', '--noproxy', '*', '--resolve', `${PROXY_NAME}:${webPort}:${PROXY_IP}`, `http://${PROXY_NAME}:${webPort}/web/login`]);
    expect(r.stdout).toMatch(/^HTTP\/1\.1 308/);
    expect(r.stdout).toContain(`location: https://${PROXY_NAME}:${webPort}/web/login`);
  });
});

describe('openssl s_client on the one port', () => {
  const sClient = (args: string[]) =>
    spawnSync('openssl', ['s_client', '-connect', `${PROXY_IP}:${webPort}`, '-servername', PROXY_NAME, '-CAfile', caFile, ...args], { input: '', encoding: 'utf8', timeout: 20_000 });

  it.each(['gateway-reversetunnel', 'gateway-proxy-ssh', 'gateway-postgres', 'gateway-mysql', 'gateway-mongodb', 'gateway-redis', 'gateway-tcp', 'gateway-postgres-ping'])(
    'ALPN %s is negotiated and routed',
    (alpn) => {
      const r = sClient(['-alpn', alpn]);
      expect(r.stdout).toContain(`ALPN protocol: ${alpn}`);
      expect(r.stdout).toContain('Verify return code: 0 (ok)');
    },
  );

  it('no ALPN gets the web; an ALPN nobody serves fails the handshake', () => {
    expect(sClient([]).stdout).toContain('Verify return code: 0 (ok)');
    const refused = sClient(['-alpn', 'imap']);
    expect(`${refused.stdout}${refused.stderr}`).toMatch(/no application protocol/i);
  });

  it('gateway-peer is not routed on the one port (peering has its own listener, 3021)', () => {
    const refused = sClient(['-alpn', 'gateway-peer']);
    expect(`${refused.stdout}${refused.stderr}`).toMatch(/no application protocol/i);
  });
});

describe('HAProxy with send-proxy-v2 in front', () => {
  let haproxy: ReturnType<typeof spawn> | undefined;
  let lbPort: number;

  beforeAll(async () => {
    lbPort = await getPort({ host: '127.0.0.4' });
    const cfg = join(dir, 'haproxy.cfg');
    await writeFile(
      cfg,
      [
        'global',
        '  maxconn 1000',
        'defaults',
        '  mode tcp',
        '  timeout connect 5s',
        '  timeout client 30s',
        '  timeout server 30s',
        'frontend fe',
        `  bind 127.0.0.4:${lbPort}`,
        '  default_backend be',
        'backend be',
        `  server proxy ${PROXY_IP}:${webPort} send-proxy-v2`,
        '',
      ].join('\n'),
    );
    haproxy = spawn('/usr/sbin/haproxy', ['-f', cfg, '-db'], { stdio: ['ignore', 'pipe', 'pipe'] });
    await waitForPort('127.0.0.4', lbPort);
  });

  afterAll(() => {
    haproxy?.kill('SIGKILL');
  });

  it("the Proxy sees the client's own address, not the balancer's", async () => {
    // The client connects from 127.0.0.9; HAProxy (127.0.0.4) forwards with a PROXY v2 header.
    const r = spawnSync(
      'curl',
      ['-sS', '--max-time', '20', '--interface', '127.0.0.9', '--cacert', caFile, '--resolve', `${PROXY_NAME}:${lbPort}:127.0.0.4`, `https://${PROXY_NAME}:${lbPort}/webapi/ping`],
      { encoding: 'utf8' },
    );
    expect(r.stderr).toBe('');
    expect(JSON.parse(r.stdout)).toMatchObject({ cluster_name: 'door.example' });
    const line = await gw.waitForLog('"client":"127.0.0.9:');
    expect(line).toContain('"connection routed"');
  });

  it('with no trusted sources listed, the start says that a PROXY header is believed from any source: banner and warning', async () => {
    const banner = await gw.waitForLog('WARNING: proxy_protocol is on and proxy_service.proxy_protocol_trusted_sources is empty');
    expect(banner).not.toContain('"level"');
    const warning = JSON.parse(await gw.waitForLog('believed from any source')) as { level: number; proxy_protocol_trusted_sources: unknown };
    expect(warning).toMatchObject({ level: 40, proxy_protocol_trusted_sources: [] });
  });
});

describe('10 000 idle connections', () => {
  it('are closed at the detection deadline, while others are served and memory stays bounded', async () => {
    const before = await rssKb(gw.process.pid!);
    const sockets: net.Socket[] = [];
    let closedByServer = 0;
    for (let i = 0; i < 10_000; i++) {
      const s = net.connect({ host: PROXY_IP, port: webPort });
      s.on('error', () => undefined);
      s.on('close', () => closedByServer++);
      sockets.push(s);
      if (i % 500 === 499) await new Promise((r) => setImmediate(r));
    }
    await Promise.all(sockets.map((s) => (s.connecting ? new Promise((r) => s.once('connect', r).once('error', r)) : undefined)));
    const during = await rssKb(gw.process.pid!);
    // Someone else is still served while 10 000 sit idle.
    const ping = curlSync(['--cacert', caFile, '--resolve', `${PROXY_NAME}:${webPort}:${PROXY_IP}`, `https://${PROXY_NAME}:${webPort}/webapi/ping`]);
    expect(JSON.parse(ping.stdout)).toMatchObject({ cluster_name: 'door.example' });
    // Every idle connection is closed by the Proxy once the detection deadline (2 s) passes.
    await new Promise<void>((resolve) => {
      const check = setInterval(() => {
        if (closedByServer >= 10_000) {
          clearInterval(check);
          resolve();
        }
      }, 100);
    });
    // Bounded: well under 20 KiB of proxy memory per idle connection (a pending connection holds no buffers).
    expect(during - before).toBeLessThan(10_000 * 20);
    for (const s of sockets) s.destroy();
  }, 120_000);
});

describe('separate listeners', () => {
  it("open the seed's ports (here on free ports) and ping advertises each one", async () => {
    const host = '127.0.0.5';
    const ports = Object.fromEntries(
      await Promise.all(['web_listen_addr', ...separateListenKeys()].map(async (k) => [k, await getPort({ host })] as const)),
    ) as Record<string, number>;
    const sep = await startGateway(
      [
        'gateway:',
        '  nodename: proxy-2',
        '  data_dir: DATA_DIR',
        '  log: { format: json }',
        'auth_service:',
        '  cluster_name: sep.example',
        '  listen_addr: 127.0.0.1:0',
        '  proxy_listener_mode: separate',
        'proxy_service:',
        `  public_addr: gw.example.com:${ports.web_listen_addr}`,
        `  web_listen_addr: ${host}:${ports.web_listen_addr}`,
        ...separateListenLines(host, { ports }),
        '',
      ].join('\n'),
    );
    try {
      for (const port of Object.values(ports)) await waitForPort(host, port, 5_000);
      const ca = join(sep.dataDir, 'admin', 'host-ca.pem');
      const web = ports.web_listen_addr!;
      const ping = JSON.parse(curlSync(['--cacert', ca, '--resolve', `gw.example.com:${web}:${host}`, `https://gw.example.com:${web}/webapi/ping`]).stdout) as { proxy: Record<string, Record<string, unknown>> & { tls_routing_enabled: boolean } };
      expect(ping.proxy.tls_routing_enabled).toBe(false);
      expect(ping.proxy.ssh).toMatchObject({
        public_addr: `gw.example.com:${web}`,
        ssh_public_addr: `gw.example.com:${ports.listen_addr}`,
        ssh_tunnel_public_addr: `gw.example.com:${ports.tunnel_listen_addr}`,
        listen_addr: `${host}:${ports.listen_addr}`,
        tunnel_listen_addr: `${host}:${ports.tunnel_listen_addr}`,
      });
      // Every database protocol's public address (redis_public_addr too): its own port, under the web's name.
      expect(ping.proxy.db).toEqual({
        postgres_public_addr: `gw.example.com:${ports.postgres_listen_addr}`,
        mysql_public_addr: `gw.example.com:${ports.mysql_listen_addr}`,
        mysql_listen_addr: `${host}:${ports.mysql_listen_addr}`,
        mongo_public_addr: `gw.example.com:${ports.mongo_listen_addr}`,
        redis_public_addr: `gw.example.com:${ports.redis_listen_addr}`,
      });
    } finally {
      await sep.stop();
    }
  });

  it('a port that is taken stops start-up with an error naming the address', async () => {
    const host = '127.0.0.5';
    const blocker = net.createServer();
    const port = await getPort({ host });
    await new Promise<void>((r) => blocker.listen(port, host, r));
    try {
      const { startGatewayExpectingFailure } = await import('../helpers/gateway.js');
      const r = await startGatewayExpectingFailure(
        ['gateway:', '  data_dir: DATA_DIR', 'auth_service:', '  listen_addr: 127.0.0.1:0', '  proxy_listener_mode: separate', 'proxy_service:', `  web_listen_addr: ${host}:0`, ...separateListenLines(host, { ports: { listen_addr: port } }), ''].join('\n'),
        [],
      );
      expect(r.status).toBe(1);
      expect(r.stderr).toContain('GW_ERR_LISTEN');
      expect(r.stderr).toContain(`${host}:${port}`);
      expect(r.stderr).toContain('proxy_service.listen_addr');
      expect(r.stderr).toContain('EADDRINUSE');
    } finally {
      blocker.close();
    }
  });
});
