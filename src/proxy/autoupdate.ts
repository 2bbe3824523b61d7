/**
 * The Proxy's public answer to agents' upgraders in a managed rollout (src/wire/autoupdate.ts):
 *
 *   GET /v1/webapi/autoupdate/agent?host_id=<uuid>[&group=<name>]   → 200 AgentInstruction
 *
 * No client certificate: the answer is only what that host should run, nothing secret, and nothing an asker says
 * moves the rollout (the Auth Service places a connected agent in the group its presence carries). Bounded: the
 * query is parsed by src/wire/autoupdatequery.ts (GW_ERR_AUTOUPDATE_QUERY, 400); each answer is kept per host and
 * group for CACHE_MS, concurrent asks for the same one share one call, at most MAX_IN_FLIGHT calls to the Auth
 * Service run at once and the cache holds at most MAX_ENTRIES, so a flood reaches the Auth Service at most once
 * per host a cache period and never piles up; each call has a deadline. An Auth Service that does not answer in
 * time, or at all, is 503 GW_ERR_AUTOUPDATE_UNAVAILABLE: the upgrader keeps what it runs and asks again. An Auth
 * Service of an earlier version (no such route) is 404, as a Proxy of an earlier version: the channels apply.
 */
import type http from 'node:http';
import { GatewayError, isGatewayError } from '../errors.js';
import { AUTOUPDATE_AGENT_PATH, type AgentInstruction } from '../wire/autoupdate.js';
import { parseInstructionQuery } from '../wire/autoupdatequery.js';
import { sendJson, sendWebError } from './webanswer.js';

export const AUTOUPDATE_ENDPOINT_DEFAULTS = Object.freeze({ cacheMs: 1500, deadlineMs: 3000, maxInFlight: 32, maxEntries: 10_000 });

export interface AutoupdateEndpointOptions {
  /** The Auth Service's answer (ProxyAuth.autoupdateInstruction). */
  instruction: (hostId: string, group?: string) => Promise<AgentInstruction>;
  clock?: () => number;
  cacheMs?: number;
  deadlineMs?: number;
  maxInFlight?: number;
  maxEntries?: number;
}

interface Entry {
  at: number;
  answer: Promise<AgentInstruction>;
}

export class AutoupdateEndpoint {
  private readonly cache = new Map<string, Entry>();
  private inFlight = 0;
  private readonly o: Required<Omit<AutoupdateEndpointOptions, 'instruction' | 'clock'>> & Pick<AutoupdateEndpointOptions, 'instruction'> & { clock: () => number };
  /** Calls made to the Auth Service (tests read it to see the cache work). */
  calls = 0;

  /** Hosts in the cache now (at most maxEntries). */
  get cachedHosts(): number {
    return this.cache.size;
  }

  constructor(options: AutoupdateEndpointOptions) {
    this.o = { ...AUTOUPDATE_ENDPOINT_DEFAULTS, clock: Date.now, ...options };
  }

  /** Answers the request when it is the endpoint's; false otherwise. */
  handle(req: http.IncomingMessage, res: http.ServerResponse): boolean {
    const [path = '', query = ''] = (req.url ?? '/').split('?', 2);
    if (path !== AUTOUPDATE_AGENT_PATH) return false;
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      sendWebError(res, new GatewayError('GW_ERR_API_METHOD_NOT_ALLOWED', `${req.method ?? ''} is not allowed on ${AUTOUPDATE_AGENT_PATH}`, { hint: 'Use GET.' }));
      return true;
    }
    this.answer(query).then(
      (a) => sendJson(res, 200, a),
      (err: unknown) => sendWebError(res, err),
    );
    return true;
  }

  /** The instruction for a query string (cached, bounded, with a deadline). */
  async answer(query: string): Promise<AgentInstruction> {
    const q = parseInstructionQuery(query);
    const key = `${q.hostId}\u0000${q.group ?? ''}`;
    const now = this.o.clock();
    const hit = this.cache.get(key);
    if (hit && now - hit.at < this.o.cacheMs) return hit.answer;
    if (this.inFlight >= this.o.maxInFlight) throw new GatewayError('GW_ERR_AUTOUPDATE_UNAVAILABLE', `the Proxy already waits on ${this.o.maxInFlight} instructions from the Auth Service; ask again later`);
    this.sweep(now);
    const answer = this.ask(q.hostId, q.group);
    this.cache.set(key, { at: now, answer });
    // A failure is not kept: the next ask tries again.
    answer.catch(() => {
      if (this.cache.get(key)?.answer === answer) this.cache.delete(key);
    });
    return answer;
  }

  private async ask(hostId: string, group: string | undefined): Promise<AgentInstruction> {
    this.inFlight += 1;
    this.calls += 1;
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new GatewayError('GW_ERR_AUTOUPDATE_UNAVAILABLE', `the Auth Service did not answer within ${this.o.deadlineMs} ms`)), this.o.deadlineMs);
    });
    try {
      return await Promise.race([this.o.instruction(hostId, group), deadline]);
    } catch (err) {
      // An Auth Service of an earlier version has no such route: 404 as from an earlier Proxy, so that the upgrader
      // keeps the channels' behaviour instead of waiting for a rollout nobody plans.
      if (isGatewayError(err, 'GW_ERR_AUTOUPDATE_UNAVAILABLE') || isGatewayError(err, 'GW_ERR_AUTOUPDATE_QUERY') || isGatewayError(err, 'GW_ERR_API_NOT_FOUND')) throw err;
      throw new GatewayError('GW_ERR_AUTOUPDATE_UNAVAILABLE', `the Auth Service could not be asked: ${(err as Error).message.slice(0, 200)}`, { cause: err });
    } finally {
      clearTimeout(timer);
      this.inFlight -= 1;
    }
  }

  /** Drops expired entries once the cache is full; past that, the oldest. */
  private sweep(now: number): void {
    if (this.cache.size < this.o.maxEntries) return;
    for (const [k, e] of this.cache) if (now - e.at >= this.o.cacheMs) this.cache.delete(k);
    for (const k of this.cache.keys()) {
      if (this.cache.size < this.o.maxEntries) break;
      this.cache.delete(k);
    }
  }
}
