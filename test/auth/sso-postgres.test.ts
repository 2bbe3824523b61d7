/**
 * Single sign-on with two Auth Services on one real PostgreSQL (high availability): a load balancer may send the
 * start of a sign-in to one and the identity provider's answer to the other, so the sign-in request lives in the
 * shared Backend; and the same answer sent to both at once (a replay racing the real one) signs in exactly once.
 * SAML here (samlify as the identity provider): it needs no network between the Auth Services and the provider.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import getPort from 'get-port';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { AuthService } from '../../src/auth/service.js';
import { openPostgresBackend, type Backend } from '../../src/backend/index.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { startPostgres, type PostgresServer } from '../helpers/databases.js';
import { rootSuite } from '../helpers/root.js';
import { startSamlIdp, type SamlIdp } from '../helpers/sso.js';

const ACS = 'https://gateway.example/webapi/sso/saml/acs';
const SP = 'https://gateway.example/saml/sp';
let dir: string;
let idp: SamlIdp;
let pg: PostgresServer;
const backends: Backend[] = [];
let a: AuthService;
let b: AuthService;

rootSuite(['dbUsers'])('single sign-on on PostgreSQL shared by two Auth Services', () => {
  beforeAll(async () => {
    setRootLogger(createLogger({ level: 'silent' }));
    dir = mkdtempSync(join(tmpdir(), 'gw-sso-pg-'));
    idp = await startSamlIdp(dir, { entityId: SP, acs: ACS });
    pg = await startPostgres({ port: await getPort({ host: '127.0.0.1' }) });
    for (let i = 0; i < 2; i++) backends.push(await openPostgresBackend({ connString: pg.url(), sweepIntervalMs: 0 }));
    a = await AuthService.open({ backend: backends[0]!, clusterName: 'pg-sso.example' });
    b = await AuthService.open({ backend: backends[1]!, clusterName: 'pg-sso.example' });
    await a.createResources(a.adminIdentity(), [{
      kind: 'saml', version: 'v2', metadata: { name: 'okta' },
      spec: { acs: ACS, service_provider_issuer: SP, entity_descriptor: idp.metadata, attributes_to_roles: [{ name: 'groups', value: 'sre', roles: ['access'] }] },
    } as never], false);
  }, 120_000);

  afterAll(async () => {
    for (const backend of backends) await backend.close();
    await pg?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('a sign-in started at one Auth Service finishes at the other', async () => {
    const started = await a.sso.startWeb('saml', 'okta', '/web/', '192.0.2.1');
    const answer = await idp.respond(started.url, 'carol', ['sre']);
    const done = await b.sso.finish('saml', { state: answer.RelayState, samlResponse: answer.SAMLResponse, browserBinding: started.binding, source: '192.0.2.1' });
    if (done.mode !== 'web') throw new Error(`a web sign-in ended in ${done.mode} mode`);
    const { bearer } = await a.handoutWebBearer(done.session.id);
    expect((await a.resolveWebSession(done.session.id, bearer)).identity).toMatchObject({ name: 'carol', roles: ['access'] });
  });

  it('the same answer sent to both at once signs in exactly once; the others are GW_ERR_SSO_STATE_INVALID', async () => {
    const started = await b.sso.startWeb('saml', 'okta', '/web/', '192.0.2.2');
    const answer = await idp.respond(started.url, 'dave', ['sre']);
    const results = await Promise.allSettled(Array.from({ length: 6 }, (_, i) =>
      (i % 2 === 0 ? a : b).sso.finish('saml', { state: answer.RelayState, samlResponse: answer.SAMLResponse, browserBinding: started.binding, source: `192.0.2.${10 + i}` })));
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    for (const r of results) if (r.status === 'rejected') expect(r.reason).toMatchObject({ code: 'GW_ERR_SSO_STATE_INVALID' });
  });
});
