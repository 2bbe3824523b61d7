/**
 * Attacks on the web surface that need more than one agent (the security review of issue 15), in one process: the
 * real Auth, Proxy and agent starters. Hostile: a rogue agent of the cluster advertises an HTTP app under the name
 * of another agent's app, with a public address of its own. Launch tokens and app sessions are bound to the app's
 * host, not its name alone: a token or an app cookie the rogue's host received never opens the other app.
 */
import https from 'node:https';
import { randomUUID } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { startAgentRole } from '../../src/roles/agent.js';
import { startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { daemonEnvironment } from '../../src/roles/environment.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { startProxyRole } from '../../src/roles/proxy.js';
import { startHttpServer, type HttpTestServer } from '../helpers/servers.js';
import { waitUntil } from '../helpers/wait.js';

const PASSWORD = 'correct horse battery';
const LEGIT_HOST = 'wiki.localhost';
const ROGUE_HOST = 'wiki.rogue.localhost';

let dir: string;
let lifecycle: Lifecycle;
let auth: AuthRole;
let web: string;
let ca: string;
const apps: HttpTestServer[] = [];

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
}

function call(method: string, path: string, host: string, headers: Record<string, string> = {}): Promise<Answer> {
  const i = web.lastIndexOf(':');
  return new Promise((resolve, reject) => {
    const req = https.request({ host: web.slice(0, i), port: Number(web.slice(i + 1)), method, path, ca, agent: false, servername: 'localhost', headers: { host, ...headers } }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text }));
    });
    req.on('error', reject);
    req.end();
  });
}

function agentConfig(name: string, host: string, app: HttpTestServer, extra: string[] = []): ReturnType<typeof parseConfig> {
  return parseConfig(
    [
      'gateway:',
      // The Proxy's agents dial it by its node name: the one in the Proxy's process must be resolvable.
      `  nodename: ${extra.length > 0 ? 'localhost' : name}`,
      `  data_dir: ${join(dir, name)}`,
      ...extra,
      'app_service:',
      '  enabled: yes',
      '  apps:',
      `    - { name: wiki, uri: "${app.url}", public_addr: ${host}, labels: {env: dev} }`,
      '',
    ].join('\n'),
    `${name} agent`,
  );
}

beforeAll(async () => {
  setRootLogger(createLogger({ level: process.env.WEB_ATTACKS_DEBUG ? 'info' : 'silent' }));
  dir = await mkdtemp(join(tmpdir(), 'gw-web-attacks-'));
  for (const who of ['legit', 'rogue']) apps.push(await startHttpServer((req, res) => res.writeHead(200, { 'content-type': 'text/plain' }).end(`${who} app for ${String(req.headers['x-gateway-user'])}\n`)));
  const config = agentConfig('legit', LEGIT_HOST, apps[0]!, [
    'auth_service:',
    '  cluster_name: attacks.example',
    '  listen_addr: 127.0.0.1:0',
    'proxy_service:',
    '  web_listen_addr: 127.0.0.1:0',
  ]);
  lifecycle = new Lifecycle();
  const limits = new ConnectionLimits(limitSettings(config));
  lifecycle.onStop('backend', () => limits.close());
  const dialer = new Dialer({ env: {} });
  auth = await startAuthRole({ config, limits, lifecycle });
  ca = auth.auth.host.tls.certPem;
  const proxy = await startProxyRole({ config, auth: auth.auth, api: auth.api, limits, dialer, lifecycle, proxyId: randomUUID() });
  web = proxy.addresses.web!;
  const environment = daemonEnvironment({});
  await startAgentRole({ config, services: ['auth_service', 'proxy_service', 'app_service'], localAuth: auth.auth, localProxy: web, dialer, environment, lifecycle });
  await startAgentRole({ config: agentConfig('rogue', ROGUE_HOST, apps[1]!), services: ['app_service'], localAuth: auth.auth, localProxy: web, dialer, environment, lifecycle });
  await waitUntil('both agents in the cluster view', () => proxy.cluster.agents().length === 2);
  await auth.auth.addUser(auth.auth.adminIdentity(), 'alice', ['access'], PASSWORD, ['root']);
}, 60_000);

afterAll(async () => {
  await lifecycle?.stop().catch(() => undefined);
  for (const app of apps) await app.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('a rogue agent advertising an app under the name of another agent\'s app', () => {
  it('hostile: the launch token and the app cookie work only on the host the launch named, never on the other app of that name', async () => {
    const s = await auth.auth.webLogin('alice', PASSWORD, '127.0.0.1');
    const creds = { cookie: `__Host-gw_session=${s.id}`, authorization: `Bearer ${s.bearer}`, origin: 'https://localhost' };
    const launch = async () => {
      const answer = await call('POST', '/webapi/apps/wiki/launch', 'localhost', creds);
      expect(answer.status, answer.text).toBe(200);
      return new URL(JSON.parse(answer.text).url as string);
    };
    // Whichever of the two the launch names, the other is the one its token and cookie must not open.
    const first = await launch();
    const named = first.hostname;
    const other = named === LEGIT_HOST ? ROGUE_HOST : LEGIT_HOST;
    const elsewhere = await call('GET', `${first.pathname}${first.search}`, other);
    expect(elsewhere.status, elsewhere.text).toBe(401);

    const second = await launch();
    const redeemed = await call('GET', `${second.pathname}${second.search}`, named);
    expect(redeemed.status, redeemed.text).toBe(200);
    const cookie = String(redeemed.headers['set-cookie']).split(';')[0]!;
    const own = await call('GET', '/', named, { cookie });
    expect(own.status, own.text).toBe(200);
    const across = await call('GET', '/', other, { cookie });
    expect(across.status, across.text).toBe(401);
  });
});
