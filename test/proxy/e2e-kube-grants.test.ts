/**
 * Kube grants go only to agents that impersonate from them (src/proxy/e2egrants.ts e2eServiceGap, the hello's
 * capability read by src/tunnel/e2e.ts e2eCapabilityOf): an agent of the version before offered end-to-end streams
 * and would have served a kube grant with its own credential and kubectl's own Impersonate-* headers. The whole path
 * with an agent of this version (which says `kube`) is test/e2e/kube-e2e.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { e2eServiceGap } from '../../src/proxy/e2egrants.js';
import { e2eCapabilityOf } from '../../src/tunnel/e2e.js';

describe('kube grants and the agent’s capability', () => {
  it('the hello’s kube flag is kept only as true; anything else is an agent of the version before', () => {
    expect(e2eCapabilityOf({ v: 1, pool: 2, kube: true })).toEqual({ v: 1, pool: 2, kube: true });
    for (const kube of [undefined, false, 'yes', 1]) expect(e2eCapabilityOf({ v: 1, pool: 2, kube })).toEqual({ v: 1, pool: 2 });
  });

  it('an agent without it is answered classic for a kube grant, with the reason; other services are not concerned', () => {
    expect(e2eServiceGap('kube', { v: 1, pool: 2 }, 'agent-old')).toMatch(/agent "agent-old" does not take end-to-end Kubernetes streams \(an earlier version/);
    expect(e2eServiceGap('kube', undefined, 'agent-old')).toBeDefined();
    expect(e2eServiceGap('kube', { v: 1, pool: 2, kube: true }, 'agent-new')).toBeUndefined();
    for (const service of ['app', 'db', 'ssh', 'desktop'] as const) expect(e2eServiceGap(service, { v: 1, pool: 2 }, 'agent-old')).toBeUndefined();
  });
});
