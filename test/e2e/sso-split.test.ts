/**
 * SAML sign-in through a Proxy's real web port, with the Auth Service in the same process and with a Proxy in its
 * own process (RemoteProxyAuth, the web port's forwarder): /webapi/ping reports the configured connector through
 * ProxyAuth.authPreference, the login start's 302 and browser-binding cookie, the ACS's form POST and its 302 with
 * the session cookie, the page's one-time bearer, and a replayed response refused: all the same through both.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { joinCluster } from '../../src/agent/identity.js';
import { parseConfig, type GatewayConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { ConnectionLimits, limitSettings } from '../../src/net/deadlines.js';
import { connectRemoteAuth, startAuthRole, type AuthRole } from '../../src/roles/auth.js';
import { Lifecycle } from '../../src/roles/lifecycle.js';
import { startProxyRole } from '../../src/roles/proxy.js';
import { request, startSamlIdp, type Answer, type SamlAnswer, type SamlIdp } from '../helpers/sso.js';

const ACS = 'https://gateway.example/webapi/sso/saml/acs';
const SP = 'https://gateway.example/saml/sp';
const dialer = new Dialer({ env: {} });
let dir: string;
let idp: SamlIdp;
let role: AuthRole;
const lifecycles: Lifecycle[] = [];
const webs: Record<string, string> = {};

const configOf = (lines: string[]): GatewayConfig => parseConfig([...lines, ''].join('\n'), 'sso split test');

beforeAll(async () => {
  setRootLogger(createLogger({ level: 'silent' }));
  dir = await mkdtemp(join(tmpdir(), 'gw-sso-split-'));
  idp = await startSamlIdp(dir, { entityId: SP, acs: ACS });
  const config = configOf(['gateway:', '  nodename: localhost', `  data_dir: ${join(dir, 'auth')}`, 'auth_service:', '  cluster_name: split-sso.example', '  listen_addr: 127.0.0.1:0', '  authentication: { type: saml, connector_name: okta }', 'proxy_service:', '  web_listen_addr: 127.0.0.1:0']);
  const lifecycle = new Lifecycle();
  lifecycles.push(lifecycle);
  const limits = new ConnectionLimits(limitSettings(config));
  lifecycle.onStop('backend', () => limits.close());
  role = await startAuthRole({ config, limits, lifecycle, dialer });
  const admin = role.auth.adminIdentity();
  await role.auth.createResources(admin, [{
    kind: 'saml', version: 'v2', metadata: { name: 'okta' },
    spec: { acs: ACS, service_provider_issuer: SP, entity_descriptor: idp.metadata, display: 'Okta', attributes_to_roles: [{ name: 'groups', value: 'sre', roles: ['access'] }] },
  } as never], false);
  const inProcess = await startProxyRole({ config, auth: role.auth, api: role.api, limits, dialer, lifecycle, proxyId: 'in-process-proxy' });
  webs.one = inProcess.addresses.web!;

  const { token } = await role.auth.addToken(admin, { roles: ['proxy'] });
  const proxyDir = join(dir, 'proxy');
  await joinCluster({ dataDir: proxyDir, server: role.address, joinedVia: 'auth', token, caPin: role.auth.caPin(), roles: ['proxy'], nodename: 'proxy', publicAddrs: [], dialer });
  const proxyConfig = configOf(['gateway:', '  nodename: localhost', `  data_dir: ${proxyDir}`, `  auth_server: ${role.address}`, 'auth_service:', '  enabled: no', 'proxy_service:', '  web_listen_addr: 127.0.0.1:0']);
  const own = new Lifecycle();
  lifecycles.unshift(own);
  const proxyLimits = new ConnectionLimits(limitSettings(proxyConfig));
  own.onStop('backend', () => proxyLimits.close());
  const remote = await connectRemoteAuth({ config: proxyConfig, dialer, lifecycle: own });
  const split = await startProxyRole({ config: proxyConfig, auth: remote.auth, api: remote.api, limits: proxyLimits, dialer, lifecycle: own, proxyId: remote.identity.hostId });
  webs.split = split.addresses.web!;
}, 60_000);

afterAll(async () => {
  for (const l of lifecycles) await l.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe.each(['one', 'split'])('SAML through the %s-process Proxy', (name) => {
  const at = (path: string, options: Parameters<typeof request>[1] = {}) => request(`https://${webs[name]}${path}`, { ca: role.auth.host.tls.certPem, ...options });
  const post = (answer: SamlAnswer, binding: string): Promise<Answer> =>
    at('/webapi/sso/saml/acs', { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded', cookie: `__Host-gw_sso=${binding}` }, body: new URLSearchParams({ SAMLResponse: answer.SAMLResponse, RelayState: answer.RelayState }).toString() });

  it('ping reports the SAML connector; the sign-in sets the session; the page gets its bearer; a replay is refused', async () => {
    expect((await at('/webapi/ping')).json().auth).toEqual({ type: 'saml', second_factor: 'off', local: { name: '' }, connector: { kind: 'saml', name: 'okta', display: 'Okta' } });
    const start = await at('/webapi/sso/saml/okta/login?redirect=/web/agents');
    expect(start.status, start.text).toBe(302);
    const binding = /__Host-gw_sso=([^;]+)/.exec(String(start.headers['set-cookie']))![1]!;
    const answer = await idp.respond(start.location!, `${name}-carol`, ['sre']);
    const done = await post(answer, binding);
    expect(done.status, done.text).toBe(302);
    expect(new URL(done.location!).pathname + new URL(done.location!).search).toBe('/web/sso-complete?redirect=%2Fweb%2Fagents');
    const session = /__Host-gw_session=([A-Za-z0-9_-]{43})/.exec(String(done.headers['set-cookie']))![1]!;
    const handout = await at('/webapi/sessions/bearer', { method: 'POST', headers: { cookie: `__Host-gw_session=${session}`, origin: `https://${webs[name]}` } });
    expect(handout.status, handout.text).toBe(200);
    expect(handout.json().user).toMatchObject({ name: `${name}-carol`, roles: ['access'] });
    const replay = await post(answer, binding);
    expect(replay.json().error.code).toBe('GW_ERR_SSO_STATE_INVALID');
  });
});
