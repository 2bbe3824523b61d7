/**
 * The protocol table (src/proxy/protocols.ts) is the single source of what the Proxy serves: the ALPN names the
 * front door's multiplexer routes, the separate listeners it binds, what connection upgrades accept and the
 * access kinds the resource lookup uses all follow from its rows. Tests add and remove rows and watch each of
 * those follow; a front door runs in-process on loopback with a throwaway certificate, as in frontdoor.test.ts.
 */
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { LABEL_FIELDS, type AccessKind } from '../../src/auth/rbac.js';
import { parseConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import type { ConnInfo } from '../../src/mux/multiplexer.js';
import { startFrontDoor, type FrontDoor } from '../../src/proxy/frontdoor.js';
import { alpnNames, PROTOCOLS, upgradeRouteFor, type Protocol } from '../../src/proxy/protocols.js';
import { findTarget } from '../../src/proxy/resources.js';
import { VersionServer } from '../../src/proxy/versions.js';
import type { ConnectedAgent } from '../../src/proxy/tunnel.js';
import { VERSION } from '../../src/version.js';
import { makeTestPki, type ServerCert, type TestPki } from '../helpers/tls.js';
import { separateListenLines } from '../helpers/listeners.js';
import { DATABASE_PROTOCOLS } from '../../src/wire/protocols.js';

setRootLogger(createLogger({ level: 'silent' }));

const HOST = 'proxy.gw.test';

/** The wire identifiers (ARCHITECTURE.md), written out here so that a change to the table has to be meant. */
const WIRE_ALPNS = [
  'http/1.1',
  'h2',
  'gateway-reversetunnel',
  // Tunnel protocol v2 (docs/tunnels.md): added by issue 14, next to v1 for agents of earlier versions.
  'gateway-reversetunnel-v2',
  'gateway-proxy-ssh',
  'gateway-postgres',
  'gateway-postgres-ping',
  'gateway-mysql',
  'gateway-mysql-ping',
  'gateway-mongodb',
  'gateway-mongodb-ping',
  'gateway-redis',
  'gateway-redis-ping',
  'gateway-tcp',
  'gateway-tcp-ping',
  // End-to-end streams (docs/tunnels.md): added by issue 29, the grant session. The stream to the agent is routed by
  // its first bytes (GWE2E1, its grant line), not by its ALPN gateway-e2e-v1, which only the agent reads.
  'gateway-grant-v1',
];

const tableAlpns = (table: readonly Protocol[]) => table.flatMap(alpnNames).map((a) => a.protocol);

let pki: TestPki;
let cert: ServerCert;
const cleanups: Array<() => unknown> = [];

beforeAll(async () => {
  pki = await makeTestPki();
  cert = await pki.serverCert({ names: [HOST], ips: ['127.0.0.1'] });
});

afterAll(async () => {
  for (const c of cleanups.reverse()) await Promise.resolve(c()).catch(() => undefined);
  await pki?.cleanup();
});

/** What the resource service was handed, by route. */
const handed: ConnInfo[] = [];

async function door(protocols: readonly Protocol[], mode: 'multiplex' | 'separate' = 'multiplex'): Promise<FrontDoor> {
  const yaml = `gateway:
  nodename: ${HOST}
auth_service:
  cluster_name: gw.test
  proxy_listener_mode: ${mode}
proxy_service:
  web_listen_addr: 127.0.0.1:0
  public_addr: ${HOST}:443
${mode === 'separate' ? separateListenLines('127.0.0.1').join('\n') : ''}
`;
  const config = parseConfig(yaml, 'protocols.test.yaml');
  const d = await startFrontDoor({
    config,
    clusterName: 'gw.test',
    tls: { key: cert.keyPem, cert: cert.certPem, ca: [pki.caPem] },
    api: (_req, res) => res.writeHead(404).end(),
    versions: new VersionServer({ channels: config.proxy_service.automatic_upgrades_channels, ownVersion: VERSION, dialer: new Dialer({ env: {} }) }),
    services: {
      resource: (stream: Duplex, info: ConnInfo) => {
        handed.push(info);
        stream.on('error', () => undefined);
        stream.pipe(stream);
      },
    },
    protocols,
  });
  cleanups.push(() => d.close());
  return d;
}

const portOf = (addr: string): number => Number(/:(\d+)$/.exec(addr)![1]);

/** The ALPN protocol negotiated, or the error code of a failed handshake. */
function offer(p: number, alpn: string[]): Promise<string> {
  return new Promise((resolve) => {
    const s = tls.connect({ host: '127.0.0.1', port: p, servername: HOST, ca: pki.caPem, ALPNProtocols: alpn });
    cleanups.push(() => s.destroy());
    s.once('secureConnect', () => {
      resolve(String(s.alpnProtocol));
      s.end();
    });
    s.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
  });
}

/** The subprotocol a connection upgrade accepts, or the HTTP status it refuses with. */
function upgrade(p: number, protocol: string): Promise<string> {
  const options: WebSocket.ClientOptions & Pick<tls.ConnectionOptions, 'servername'> = { ca: pki.caPem, servername: HOST };
  const ws = new WebSocket(`wss://127.0.0.1:${p}/webapi/connectionupgrade`, [protocol], options);
  cleanups.push(() => ws.terminate());
  return new Promise((resolve, reject) => {
    ws.once('open', () => resolve(ws.protocol));
    ws.once('unexpected-response', (_req, res) => resolve(String(res.statusCode)));
    ws.once('error', reject);
  });
}

const extra: Protocol = { name: 'gateway-test', kind: 'resource', on: { alpn: ['gateway-test'] }, ping: true, access: ['app'] };

describe('the multiplexer routes what the table lists, and nothing else', () => {
  it('the ALPN names routed on the one port are the table’s, which are the wire identifiers', async () => {
    const d = await door(PROTOCOLS);
    expect(d.mux!.routes.alpnProtocols().sort()).toEqual(tableAlpns(PROTOCOLS).sort());
    expect(tableAlpns(PROTOCOLS).sort()).toEqual([...WIRE_ALPNS].sort());
    // Routed by their first bytes, not TLS: end-to-end streams (their grant line) and the agents' data connections.
    expect(d.mux!.routes.forSniffed('gwe2e')?.name).toBe('gateway-e2e');
    expect(d.mux!.routes.forSniffed('gwdata')?.name).toBe('gateway-data');
  });

  it('a row added to the table is routed (its -ping too), reaches its kind’s service and can be upgraded to', async () => {
    const d = await door([...PROTOCOLS, extra]);
    expect(d.mux!.routes.alpnProtocols()).toEqual(expect.arrayContaining(['gateway-test', 'gateway-test-ping']));
    const p = portOf(d.addresses.web!);
    expect(await offer(p, ['gateway-test-ping'])).toBe('gateway-test-ping');
    await expect.poll(() => handed.find((i) => i.route === 'gateway-test')).toMatchObject({ alpn: 'gateway-test-ping', ping: true });
    expect(await upgrade(p, 'gateway-test')).toBe('gateway-test');

    const without = await door(PROTOCOLS);
    const q = portOf(without.addresses.web!);
    expect(await offer(q, ['gateway-test'])).toBe('ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL');
    expect(await upgrade(q, 'gateway-test')).toBe('400');
  });

  it('a row removed from the table is no longer routed, upgraded to, or given a separate listener', async () => {
    const table = PROTOCOLS.filter((row) => row.name !== 'gateway-mysql');
    const d = await door(table);
    expect(d.mux!.routes.alpnProtocols()).not.toContain('gateway-mysql');
    expect(d.mux!.routes.alpnProtocols()).not.toContain('gateway-mysql-ping');
    const p = portOf(d.addresses.web!);
    expect(await offer(p, ['gateway-mysql'])).toBe('ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL');
    expect(await offer(p, ['gateway-postgres'])).toBe('gateway-postgres');
    expect(await upgrade(p, 'gateway-mysql')).toBe('400');

    const full = await door(PROTOCOLS, 'separate');
    const fewer = await door(table, 'separate');
    expect(Object.keys(full.addresses)).toContain('mysql');
    expect(Object.keys(fewer.addresses).sort()).toEqual(Object.keys(full.addresses).filter((k) => k !== 'mysql').sort());
  });

  it('separate listeners bind in the table’s order', async () => {
    const d = await door(PROTOCOLS, 'separate');
    const expected = PROTOCOLS.flatMap((row) => (row.listener && row.listener.key !== 'kube_listen_addr' ? [row.listener.name] : []));
    expect(Object.keys(d.addresses)).toEqual(expected);
    expect(expected).toEqual(['web', 'ssh', 'tunnel', 'mysql', 'postgres', 'mongo', 'redis']);
  });
});

describe('connection upgrades', () => {
  it('carry every ALPN name of the table but the web’s own', () => {
    for (const row of PROTOCOLS) {
      for (const { protocol } of alpnNames(row)) expect(upgradeRouteFor(protocol)?.name).toBe(row.kind === 'web' ? undefined : row.name);
    }
    expect(upgradeRouteFor('gateway-reversetunnel-ping')).toBeUndefined();
    // Peering is not the front door's: its own listener (3021), never an upgrade or a route of the one port.
    expect(upgradeRouteFor('gateway-peer')).toBeUndefined();
    expect(upgradeRouteFor('kube')).toBeUndefined();
  });
});

describe('access kinds come from the table', () => {
  /** An agent that serves one resource of every kind, each named "x". */
  const everything = {
    hostId: 'host-1',
    nodename: 'x',
    services: ['ssh', 'db', 'app', 'desktop', 'kube'],
    connectedAt: new Date(0),
    resources: {
      node_labels: { kind: 'node' },
      databases: DATABASE_PROTOCOLS.map((protocol) => ({ name: 'x', protocol, labels: { kind: 'db' } })),
      apps: [{ name: 'x', kind: 'tcp', labels: { kind: 'app' } }],
      desktops: [{ name: 'x', labels: { kind: 'desktop' } }],
      kube_clusters: [{ name: 'x', labels: { kind: 'kube' } }],
    },
  } as unknown as ConnectedAgent;

  it('every RBAC access kind is reached through some row', () => {
    expect(new Set(PROTOCOLS.flatMap((row) => row.access))).toEqual(new Set(Object.keys(LABEL_FIELDS)));
  });

  it.each(PROTOCOLS.map((row) => [row.name, row] as const))('%s: a lookup finds only the kinds its row lists, each of them', (_name, row) => {
    const found = new Set<AccessKind>();
    for (const kind of [undefined, 'app', 'desktop'] as const) {
      const t = findTarget([everything], row.name, { resource: 'x', ...(kind ? { kind } : {}) });
      if (t) found.add(t.access);
    }
    expect(found).toEqual(new Set(row.access));
  });

  it('dropping a kind from a row stops the lookup from finding it', () => {
    const table = PROTOCOLS.map((row) => (row.name === 'gateway-tcp' ? { ...row, access: ['app' as const] } : row));
    expect(findTarget([everything], 'gateway-tcp', { resource: 'x', kind: 'desktop' })?.access).toBe('windows_desktop');
    expect(findTarget([everything], 'gateway-tcp', { resource: 'x', kind: 'desktop' }, table)).toBeUndefined();
  });

  it('a database route finds only databases of the row’s protocol', () => {
    for (const row of PROTOCOLS.filter((r) => r.access.includes('db'))) {
      expect(row.database).toBeDefined();
      const only = { ...everything, resources: { ...everything.resources, databases: everything.resources.databases.filter((db) => db.protocol === row.database) } } as ConnectedAgent;
      expect(findTarget([only], row.name, { resource: 'x' })?.access).toBe('db');
      const others = { ...everything, resources: { ...everything.resources, databases: everything.resources.databases.filter((db) => db.protocol !== row.database) } } as ConnectedAgent;
      expect(findTarget([others], row.name, { resource: 'x' })).toBeUndefined();
    }
  });
});
