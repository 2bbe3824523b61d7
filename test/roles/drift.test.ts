/**
 * Channel drift with real Proxies: two proxy roles on one in-process Auth Service, whose
 * automatic_upgrades_channels differ. Both log the warning naming the Proxies and the channel, GET /v1/status
 * (what `gwctl status` prints) shows it, a SIGHUP-style setChannels to the same channels logs "channels agree
 * again" on both, and the version server's answers name the Proxy that answered.
 */
import https from 'node:https';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ApiClient } from '../../src/client/api.js';
import { parseConfig, type GatewayConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { startAuthRole } from '../../src/roles/auth.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { startProxyRole } from '../../src/roles/proxy.js';
import { captureLogRecords } from '../helpers/logs.js';
import { waitUntil } from '../helpers/wait.js';

const A = '7d4a5c3e-0000-4000-8000-0000000d0001';
const B = '7d4a5c3e-0000-4000-8000-0000000d0002';

let dir: string;
let lifecycle: Lifecycle;
let lines: Array<Record<string, unknown>>;
const dialer = new Dialer({ env: {} });

function config(nodename: string, stable: string): GatewayConfig {
  return parseConfig(
    [
      'gateway:',
      `  nodename: ${nodename}`,
      `  data_dir: ${join(dir, 'data')}`,
      'auth_service:',
      '  cluster_name: drift.example',
      '  listen_addr: 127.0.0.1:0',
      'proxy_service:',
      '  web_listen_addr: 127.0.0.1:0',
      '  automatic_upgrades_channels:',
      '    stable/cloud:',
      `      static_version: ${stable}`,
      '    edge:',
      '      static_version: v18.0.0',
      '',
    ].join('\n'),
    'drift test',
  );
}

function get(addr: string, path: string, ca: string): Promise<{ status: number; headers: Record<string, unknown>; body: string }> {
  const i = addr.lastIndexOf(':');
  return new Promise((resolve, reject) => {
    const req = https.get({ host: addr.slice(0, i), port: Number(addr.slice(i + 1)), path, ca, agent: false }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.once('error', reject);
  });
}

const warnings = (proxy: string) => lines.filter((l) => l.component === 'channel-drift' && l.proxy === proxy && l.level === 40);
const agreed = (proxy: string) => lines.filter((l) => l.component === 'channel-drift' && l.proxy === proxy && String(l.msg).startsWith('channels agree again'));

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-drift-'));
  lines = captureLogRecords();
  lifecycle = new Lifecycle();
});

afterEach(async () => {
  await lifecycle.stop().catch(() => undefined);
  setRootLogger(createLogger({ level: 'silent' }));
  await rm(dir, { recursive: true, force: true });
});

describe('channel drift between two Proxies', () => {
  it('both warn naming the Proxies and the channel, status shows it, the same channels again log "agree", answers name the Proxy', async () => {
    const configA = config('proxy-a', 'v17.0.1');
    const configB = config('proxy-b', 'v17.0.2');
    const limits = new ConnectionLimits(limitSettings(configA));
    lifecycle.onStop('backend', () => limits.close());
    const auth = await startAuthRole({ config: configA, limits, lifecycle });
    const proxyA = await startProxyRole({ config: configA, auth: auth.auth, api: auth.api, limits, dialer, lifecycle, proxyId: A });
    const proxyB = await startProxyRole({ config: configB, auth: auth.auth, api: auth.api, limits, dialer, lifecycle, proxyId: B });

    // Every Proxy logs it, once, naming both Proxies and the values on each side (only the channel that differs).
    await waitUntil('both Proxies warn about the drift', () => warnings(A).length > 0 && warnings(B).length > 0);
    for (const self of [A, B]) {
      const [w] = warnings(self);
      expect(w!.msg).toContain(`proxy-a (${A})`);
      expect(w!.msg).toContain(`proxy-b (${B})`);
      expect(w!.msg).toContain('stable/cloud: "static v17.0.1" on proxy-a');
      expect(w!.msg).not.toContain('edge:');
      expect(w!.channels).toEqual({ 'stable/cloud': { [`proxy-a (${A})`]: 'static v17.0.1', [`proxy-b (${B})`]: 'static v17.0.2' } });
    }

    // GET /v1/status, as gwctl calls it with the local admin identity over the Auth API's mutual TLS.
    const adminDir = join(dir, 'data', 'admin');
    const api = new ApiClient({ address: auth.address, server: 'auth', dialer, ca: await readFile(join(adminDir, 'host-ca.pem'), 'utf8'), cert: await readFile(join(adminDir, 'cert.pem'), 'utf8'), key: await readFile(join(adminDir, 'key.pem'), 'utf8') });
    const status = await api.call<{ proxies: Array<{ id: string; nodename: string }>; channel_drift: { agree: boolean; channels: unknown[] } }>('GET', '/v1/status');
    expect(status.proxies.map((p) => [p.id, p.nodename])).toEqual([[A, 'proxy-a'], [B, 'proxy-b']]);
    expect(status.channel_drift).toMatchObject({
      agree: false,
      channels: [{ channel: 'stable/cloud', values: [{ value: 'static v17.0.1', proxies: [{ id: A, nodename: 'proxy-a' }] }, { value: 'static v17.0.2', proxies: [{ id: B, nodename: 'proxy-b' }] }] }],
    });

    // The version server's answers name the Proxy that answered: a version, and a JSON error (hostile: an unknown channel).
    const ca = auth.auth.host.tls.certPem;
    const fromA = await get(proxyA.addresses.web!, '/v1/webapi/automaticupgrades/channel/stable/cloud/version', ca);
    expect(fromA).toMatchObject({ status: 200, body: 'v17.0.1', headers: { 'x-gateway-proxy': A } });
    const fromB = await get(proxyB.addresses.web!, '/v1/webapi/automaticupgrades/channel/stable/cloud/version', ca);
    expect(fromB).toMatchObject({ status: 200, body: 'v17.0.2', headers: { 'x-gateway-proxy': B } });
    const unknown = await get(proxyB.addresses.web!, '/v1/webapi/automaticupgrades/channel/..%2F..%2Fetc/version', ca);
    expect(unknown.status).toBe(400);
    expect(unknown.headers['x-gateway-proxy']).toBe(B);
    expect(JSON.parse(unknown.body)).toMatchObject({ error: { code: 'GW_ERR_VERSION_BAD_PATH' }, proxy: B });

    // Heartbeats do not repeat the warning: only a change of the drift does.
    const before = warnings(A).length + warnings(B).length;
    // SIGHUP on B with A's channels: both say the channels agree again, and status agrees.
    proxyB.setChannels(configA.proxy_service.automatic_upgrades_channels);
    await waitUntil('both Proxies log that the channels agree again', () => agreed(A).length > 0 && agreed(B).length > 0);
    expect(warnings(A).length + warnings(B).length).toBe(before);
    expect((await api.call<{ channel_drift: { agree: boolean } }>('GET', '/v1/status')).channel_drift).toEqual({ agree: true, groups: [expect.objectContaining({ proxies: [{ id: A, nodename: 'proxy-a' }, { id: B, nodename: 'proxy-b' }] })], channels: [] });
    expect((await get(proxyB.addresses.web!, '/v1/webapi/automaticupgrades/channel/stable/cloud/version', ca)).body).toBe('v17.0.1');
  });
});

describe('/webapi/find behind a balancer', () => {
  it("lists every live Proxy and every Proxy's tunnel host key (a raw SSH tunnel may land on any of them)", async () => {
    const configA = config('proxy-a', 'v17.0.1');
    const limits = new ConnectionLimits(limitSettings(configA));
    lifecycle.onStop('backend', () => limits.close());
    const auth = await startAuthRole({ config: configA, limits, lifecycle });
    const proxyA = await startProxyRole({ config: configA, auth: auth.auth, api: auth.api, limits, dialer, lifecycle, proxyId: A });
    await startProxyRole({ config: config('proxy-b', 'v17.0.1'), auth: auth.auth, api: auth.api, limits, dialer, lifecycle, proxyId: B });
    const records = await auth.auth.listProxies();
    const keys = records.map((r) => r.tunnel_host_key);
    expect(keys.every((k) => /^ecdsa-sha2-nistp256 /.test(k ?? ''))).toBe(true);
    expect(new Set(keys).size).toBe(2);
    const ca = auth.auth.host.tls.certPem;
    await waitUntil('A has heard of B', async () => (JSON.parse((await get(proxyA.addresses.web!, '/webapi/find', ca)).body) as { proxies: unknown[] }).proxies.length === 2);
    const find = JSON.parse((await get(proxyA.addresses.web!, '/webapi/find', ca)).body) as { proxies: Array<{ id: string }>; tunnel_host_keys: string[] };
    expect(find.proxies.map((p) => p.id)).toEqual([A, B]);
    expect([...find.tunnel_host_keys].sort()).toEqual([...keys].sort());
  });
});
