/**
 * The query of an agent's instruction (GET /v1/webapi/autoupdate/agent on the Proxy, /v1/autoupdate/instruction
 * on the Auth API: src/wire/autoupdate.ts), parsed the same way by both and built the same way by the upgraders:
 * bounded (the whole query at most MAX_QUERY characters), host_id a host ID as the cluster issues them (a UUID),
 * group a rollout group's name. Pure.
 */
import { GatewayError } from '../errors.js';

export const MAX_INSTRUCTION_QUERY = 256;
const HOST_ID = /^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$/;
const GROUP = /^[a-z0-9-]{1,32}$/;

export interface InstructionQuery {
  hostId: string;
  group?: string;
}

function refuse(message: string): GatewayError {
  return new GatewayError('GW_ERR_AUTOUPDATE_QUERY', message);
}

/** The query string (after "?", raw); GW_ERR_AUTOUPDATE_QUERY for anything but one host_id and at most one group. */
export function parseInstructionQuery(raw: string): InstructionQuery {
  if (raw.length > MAX_INSTRUCTION_QUERY) throw refuse(`the query has ${raw.length} characters; at most ${MAX_INSTRUCTION_QUERY}`);
  const q = new URLSearchParams(raw);
  for (const key of q.keys()) if (key !== 'host_id' && key !== 'group') throw refuse(`unknown query parameter ${JSON.stringify(key.slice(0, 32))}: only host_id and group`);
  const hosts = q.getAll('host_id');
  const groups = q.getAll('group');
  if (hosts.length !== 1 || groups.length > 1) throw refuse('give host_id once, and group at most once');
  const hostId = hosts[0]!.toLowerCase();
  if (!HOST_ID.test(hostId)) throw refuse('host_id is not a host ID (a UUID, as in the agent\'s data directory)');
  const group = groups[0];
  if (group !== undefined && !GROUP.test(group)) throw refuse('group is not a rollout group\'s name ([a-z0-9-]{1,32})');
  return { hostId, ...(group === undefined ? {} : { group }) };
}

/** The query an upgrader sends. */
export function instructionQuery(q: InstructionQuery): string {
  return new URLSearchParams({ host_id: q.hostId, ...(q.group === undefined ? {} : { group: q.group }) }).toString();
}
