/**
 * What a proxy authentication scheme is to the Dialer, and the one place that decides which scheme answers a 407
 * (as curl's --proxy-anyauth): the strongest scheme the proxy offered that this client can do, never a weaker
 * one. Each scheme is one file of src/dial/auth/ (negotiate.ts, ntlm.ts, digest.ts, basic.ts) and one entry of
 * PROXY_AUTH_SCHEMES. docs/dialing.md, "Proxy authentication", says it for operators.
 */
import type { ErrorCode } from '../../errors.js';
import type { ProxySpec } from '../select.js';
import { basicScheme } from './basic.js';
import type { Challenge } from './challenge.js';
import { digestScheme } from './digest.js';
import { negotiateScheme } from './negotiate.js';
import { ntlmScheme } from './ntlm.js';
import type { ProxyAuthScheme } from './types.js';

export type { AuthAbility, AuthRequest, AuthSession, ProxyAuthScheme } from './types.js';

/** Every scheme the Dialer knows, strongest first. */
export const PROXY_AUTH_SCHEMES: readonly ProxyAuthScheme[] = [negotiateScheme, ntlmScheme, digestScheme, basicScheme].sort((a, b) => b.strength - a.strength);

export type AuthChoice =
  | { scheme: ProxyAuthScheme; challenges: Challenge[] }
  | { scheme: undefined; offered: string[]; declined: string[]; code?: ErrorCode };

/**
 * The strongest scheme among `challenges` that this client can do for `proxy`, with its challenges; or none, with
 * what was offered and why each offered scheme this client knows was declined (for the error message).
 */
export function chooseScheme(
  challenges: readonly Challenge[],
  proxy: ProxySpec,
  schemes: readonly ProxyAuthScheme[] = PROXY_AUTH_SCHEMES,
): AuthChoice {
  const declined: string[] = [];
  let code: ErrorCode | undefined;
  for (const scheme of [...schemes].sort((a, b) => b.strength - a.strength)) {
    const mine = challenges.filter((c) => c.key === scheme.name.toLowerCase());
    if (mine.length === 0) continue;
    const ability = scheme.can(proxy);
    if (!ability.ok) {
      declined.push(`${scheme.name}: ${ability.why}`);
      code ??= ability.code;
      continue;
    }
    const usable = mine.filter((c) => scheme.accepts(c));
    if (usable.length === 0) {
      declined.push(`${scheme.name}: no challenge this client can answer (${describeParams(mine[0]!)})`);
      continue;
    }
    return { scheme, challenges: usable };
  }
  const offered = [...new Map(challenges.map((c) => [c.key, c.scheme])).values()];
  return { scheme: undefined, offered, declined, ...(code ? { code } : {}) };
}

/** The parameters that decide whether a challenge can be answered, never a nonce or a token. */
function describeParams(c: Challenge): string {
  const shown = ['algorithm', 'qop'].filter((k) => c.params.has(k)).map((k) => `${k}=${c.params.get(k)!}`);
  return shown.length > 0 ? shown.join(' ') : 'no parameters';
}

/** What `gateway dial-plan` says about a proxy URL: the schemes it can answer with, strongest first, and why (each). */
export interface ProxyAuthPlan {
  schemes: string[];
  reason: string;
  /** Every scheme this client knows, strongest first: whether it can answer this proxy, and why (or why not). */
  each: Array<{ scheme: string; ok: boolean; why: string }>;
}

export function describeProxyAuth(proxy: ProxySpec, schemes: readonly ProxyAuthScheme[] = PROXY_AUTH_SCHEMES): ProxyAuthPlan {
  if (proxy.protocol === 'socks5' || proxy.protocol === 'socks5h') {
    // SOCKS5 has no 407: the server picks a method from what the greeting offers (socks.ts).
    return proxy.username === undefined
      ? { schemes: [], each: [], reason: 'SOCKS5: offers no authentication (a server that requires a method fails the dial)' }
      : { schemes: ['username/password'], each: [], reason: `SOCKS5: offers username/password (RFC 1929) as user "${proxy.username}", sent only if the server chooses it` };
  }
  const each = [...schemes].sort((a, b) => b.strength - a.strength).map((s) => ({ scheme: s.name, ...s.can(proxy) }));
  const able = each.filter((e) => e.ok).map((e) => e.scheme);
  const reason =
    able.length === 0
      ? 'answers no authentication challenge (a 407 fails)'
      : `answers a 407 with the strongest of ${able.join(', ')} that the proxy offers, never a weaker one`;
  return { schemes: able, reason, each: each.map(({ scheme, ok, why }) => ({ scheme, ok, why })) };
}
