/**
 * gwsh's grants for Kubernetes (src/client/e2e.ts, used by gwsh proxy kube) against a TLS server written from the
 * contract (test/helpers/e2eclient.ts): the kube route maps to the service kube, and a Proxy that takes grant
 * requests but not for the kube route (the version before kube grants answers GW_ERR_TUNNEL_PROTOCOL, "not a
 * resource route") sends the connection the classic way under auto, never fails it.
 */
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { GrantSession, KUBE_ROUTE, serviceOfTarget } from '../../src/client/e2e.js';
import { Dialer } from '../../src/dial/dialer.js';
import { writeJsonLine } from '../../src/stream/lines.js';
import { failureOf } from '../helpers/errors.js';
import { makeE2EPki, profileFor, startFakeProxy, type E2EPki, type FakeProxy } from '../helpers/e2eclient.js';

let pki: E2EPki;
beforeAll(async () => {
  pki = await makeE2EPki();
});

const proxies: FakeProxy[] = [];
const sessions: GrantSession[] = [];
afterEach(async () => {
  for (const s of sessions.splice(0)) s.close();
  for (const p of proxies.splice(0)) await p.close();
});

async function sessionWith(answer: (id: number) => Record<string, unknown>): Promise<GrantSession> {
  const proxy = await startFakeProxy(pki, { onGrant: (req, socket) => writeJsonLine(socket, answer(req.id)) });
  proxies.push(proxy);
  const session = new GrantSession({ profile: profileFor(pki, proxy.address), dialer: new Dialer({ env: {} }), address: proxy.address, timeoutMs: 5_000 });
  sessions.push(session);
  return session;
}

describe('grants for Kubernetes', () => {
  it('the kube route is the service kube', () => {
    expect(serviceOfTarget({ alpn: KUBE_ROUTE })).toBe('kube');
  });

  it('a Proxy that gives no grants for the kube route (an earlier version): the classic route, with its words', async () => {
    const session = await sessionWith((id) => ({ id, ok: false, error: { code: 'GW_ERR_TUNNEL_PROTOCOL', message: 'the grant request\'s route "kube" is not a resource route' } }));
    expect(await session.request({ resource: 'dev', route: KUBE_ROUTE })).toEqual({
      kind: 'classic',
      reason: 'the Proxy gives no grants for this route (an earlier version): the grant request\'s route "kube" is not a resource route',
    });
  });

  it("the kube route's refusals stay errors with their code", async () => {
    const session = await sessionWith((id) => ({ id, ok: false, error: { code: 'GW_ERR_KUBE_NO_IMPERSONATION', message: 'your roles allow no Kubernetes user or group' } }));
    expect((await failureOf(session.request({ resource: 'dev', route: KUBE_ROUTE }))).code).toBe('GW_ERR_KUBE_NO_IMPERSONATION');
  });
});
