/**
 * Rate-limit hits: each refusal by one of the gateway's attempt limiters, by which limit refused (login: wrong
 * passwords per user and address; join: failed joins per address; sso_start and sso_finish: single sign-ons per
 * address; audit: a Proxy's session events per minute). Neither the user nor the address is a label: the log line
 * of the refusal names them.
 */
import { counter } from './define.js';

export const RATE_LIMITS = ['login', 'join', 'sso_start', 'sso_finish', 'audit'] as const;

const hits = counter({ name: 'gateway_rate_limit_hits_total', help: 'Requests refused by a rate limit, by limit.', area: 'rate limits', labels: { limit: RATE_LIMITS } });

export function recordRateLimited(limit: (typeof RATE_LIMITS)[number]): void {
  hits.inc({ limit });
}
