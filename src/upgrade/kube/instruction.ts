/**
 * The Kubernetes updater asks the Proxy what its release should run under a managed rollout (issue 28;
 * docs/kubernetes-updater.md, "Managed rollouts"):
 *
 *   GET https://<proxy>/v1/webapi/autoupdate/agent?host_id=<the agent's host id>&group=<the release's group>
 *     200 → parseAgentInstruction (src/wire/autoupdate.ts): managed:false is { unmanaged }, else { instruction }
 *     404 → { unmanaged }: a Proxy from before managed rollouts; the seed's channel behaviour goes on
 *     anything else, no answer within the deadline, over AGENT_INSTRUCTION_MAX_BYTES, or a body the parser refuses
 *         → { error, code: GW_ERR_AUTOUPDATE_INSTRUCTION }: decide() changes nothing and does not ask the channel
 *
 * The host id is the one the agent exports next to its schedule (key agent-host-id of the shared-state Secret);
 * until it has, the updater asks with its group only (the rollout then treats the release as a member that is not a
 * canary). The deadline covers the whole exchange (a peer dripping one byte a second is cut at it), on top of the
 * Dialer's idle timeout. Nothing here throws: every failure is an answer decide() turns into "nothing changes".
 */
import type { Logger } from 'pino';
import { memberOrOutsideServerIdentity } from '../../client/api.js';
import { fetchThroughDialer } from '../../dial/agent.js';
import type { Dialer } from '../../dial/dialer.js';
import { GatewayError, toGatewayError } from '../../errors.js';
import { logger } from '../../log.js';
import { AGENT_INSTRUCTION_MAX_BYTES, AUTOUPDATE_AGENT_PATH, parseAgentInstruction } from '../../wire/autoupdate.js';
import { HOST_ID_SECRET_KEY } from './client.js';
import type { InstructionInput } from './decide.js';

export { HOST_ID_SECRET_KEY };

/** The whole request, connection to last byte. */
export const INSTRUCTION_DEADLINE_MS = 10_000;
/** A host id as the agent exports it (a UUID); anything else in the Secret is not sent. */
export const HOST_ID_PATTERN = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** "https://<proxy>/v1/webapi/autoupdate/agent" from --proxy-addr (host:port) or the origin of a channel URL. */
export function instructionUrl(proxyAddrOrUrl: string): string {
  const origin = /^https?:\/\//.test(proxyAddrOrUrl) ? new URL(proxyAddrOrUrl).origin : `https://${proxyAddrOrUrl.replace(/\/+$/, '')}`;
  return `${origin}${AUTOUPDATE_AGENT_PATH}`;
}

export type InstructionSource = (hostId: string | undefined) => Promise<InstructionInput>;

const proxyOrOutside = memberOrOutsideServerIdentity('proxy');

export function instructionSource(options: {
  url: string;
  group: string;
  dialer: Dialer;
  ca?: string;
  rejectUnauthorized?: boolean;
  deadlineMs?: number;
  log?: Logger;
}): InstructionSource {
  const log = options.log ?? logger('kube-updater');
  const deadlineMs = options.deadlineMs ?? INSTRUCTION_DEADLINE_MS;
  return async (hostId) => {
    const query = new URLSearchParams({ ...(hostId ? { host_id: hostId } : {}), group: options.group });
    const url = `${options.url}?${query.toString()}`;
    const deadline = AbortSignal.timeout(deadlineMs);
    try {
      const r = await fetchThroughDialer(url, {
        dialer: options.dialer,
        timeoutMs: deadlineMs,
        signal: deadline,
        maxBodyBytes: AGENT_INSTRUCTION_MAX_BYTES,
        headers: { accept: 'application/json' },
        ...(options.ca === undefined ? {} : { ca: options.ca }),
        ...(options.rejectUnauthorized === undefined ? {} : { rejectUnauthorized: options.rejectUnauthorized }),
        tlsPeer: { server: 'proxy', untrustedHint: "Give the CA that signs the Proxy's certificate with --ca-file (the chart: updater.proxyCASecret)." },
        checkServerIdentity: proxyOrOutside,
      });
      if (r.status === 404) return { unmanaged: 'the Proxy does not serve managed rollouts (404)' };
      if (r.status !== 200) throw new GatewayError('GW_ERR_AUTOUPDATE_INSTRUCTION', `${options.url} answered HTTP ${r.status}`);
      const parsed = parseAgentInstruction(r.body.toString('utf8'));
      if (!parsed.ok) throw new GatewayError('GW_ERR_AUTOUPDATE_INSTRUCTION', parsed.why);
      const instruction = parsed.instruction;
      if (!instruction.managed) return { unmanaged: `no managed rollout: ${instruction.reason}` };
      return { instruction };
    } catch (err) {
      const e = toGatewayError(err);
      // An abort is the deadline's: say so rather than Node's "The operation was aborted".
      const message = e.code === 'GW_ERR_AUTOUPDATE_INSTRUCTION' ? e.message : deadline.aborted ? `no answer within ${deadlineMs} ms` : `${e.code}: ${e.message}`;
      log.debug({ code: e.code, err: message }, 'cannot read the rollout instruction');
      return { error: message, code: 'GW_ERR_AUTOUPDATE_INSTRUCTION' };
    }
  };
}
