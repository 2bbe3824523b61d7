/**
 * /webapi/ping's `auth` (src/proxy/ping.ts): the Auth Service's authentication preference as ping reports it,
 * and the Proxy's cache of it (asked at most every 10 s, concurrent pings share one question, a failure keeps
 * the last answer so that ping answers even while the Auth Service does not).
 */
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../src/config/index.js';
import { AUTH_PREFERENCE_CACHE_MS, cachedAuthPreference, pingResponse } from '../../src/proxy/ping.js';

const config = parseConfig('gateway: { nodename: p1 }\n', 'test');

describe('ping auth', () => {
  it('reports local by default and the connector when one is preferred', () => {
    expect(pingResponse(config, 'c').auth).toEqual({ type: 'local', second_factor: 'off', local: { name: '' } });
    expect(pingResponse(config, 'c', {}, { type: 'saml', connector: { kind: 'saml', name: 'okta', display: 'Okta' } }).auth).toEqual({
      type: 'saml', second_factor: 'off', local: { name: '' }, connector: { kind: 'saml', name: 'okta', display: 'Okta' },
    });
  });

  it('asks at most every AUTH_PREFERENCE_CACHE_MS; a failure (the Auth Service down) keeps the last answer', async () => {
    let now = 0;
    let asked = 0;
    let fail = false;
    const get = cachedAuthPreference(async () => {
      asked++;
      if (fail) throw new Error('unreachable');
      return { type: 'oidc', connector: { kind: 'oidc', name: 'corp', display: 'Corp' } };
    }, () => now);
    const [a, b] = await Promise.all([get(), get()]);
    expect(a).toEqual(b);
    expect(asked).toBe(1);
    now += AUTH_PREFERENCE_CACHE_MS - 1;
    await get();
    expect(asked).toBe(1);
    now += 2;
    fail = true;
    expect((await get()).type).toBe('oidc');
    expect(asked).toBe(2);
  });
});
