/**
 * The agents page's rollout panel (issue 28's managed rollouts): what must be seen first (a rollback, a halted
 * group, a suspended rollout, stale agents), then a card per group with its state and why, its next start in its
 * time zone, its canaries and their states, its agents by version and its stale agents. Everything shown is
 * computed by web/src/lib/rollout.ts (pure, tested there). A status with managed: false shows nothing: the page stays
 * the seed's channel view. A Proxy too old for the route (404) is the same as managed: false.
 */
import type { ApiError } from '../lib/errors.js';
import { canaryBadge, capped, clip, groupBadge, inZone, rolloutAlerts, rolloutSummary, shownGroups, versionCounts } from '../lib/rollout.js';
import { utcStamp } from '../lib/time.js';
import { Badge, ErrorBox, Notice } from '../components/ui.js';
import type { RolloutGroup, RolloutStatus } from '../types.js';

export function RolloutPanel({ status, error, now }: { status: RolloutStatus | undefined; error: ApiError | Error | undefined; now: number }) {
  if (error) return (error as Partial<ApiError>).status === 404 ? null : <ErrorBox error={error} testid="rollout-error" />;
  if (!status || status.managed !== true) return null;
  return (
    <section class="card" data-testid="rollout-panel" data-mode={clip(status.mode, 32)}>
      <div class="rollout-head">
        <h2 class="rollout-title">Rollout</h2>
        <div class="muted small" data-testid="rollout-summary">
          {rolloutSummary(status)}
          {status.rollout_id ? <span class="mono"> · {clip(status.rollout_id, 64)}</span> : null}
        </div>
      </div>
      {rolloutAlerts(status).map((a) => (
        <Notice kind={a.kind} testid={a.testid} key={a.testid}>{a.text}</Notice>
      ))}
      <div class="rollout-groups">
        {shownGroups(status).map((g, i) => <GroupCard group={g} now={now} key={`${i}-${g.name}`} />)}
      </div>
    </section>
  );
}

function GroupCard({ group, now }: { group: RolloutGroup; now: number }) {
  const name = clip(group.name, 64);
  const badge = groupBadge(group.state);
  const canaries = capped<RolloutGroup['canaries'][number]>(group.canaries);
  const stale = capped<RolloutGroup['stale'][number]>(group.stale);
  return (
    <div class={`rollout-group rollout-${badge.kind}`} data-testid={`rollout-group-${name}`} data-state={clip(group.state, 32)}>
      <div class="rollout-group-head">
        <span class="strong">{name}</span> <Badge kind={badge.kind} testid={`rollout-state-${name}`}>{badge.text}</Badge>
      </div>
      <div class="small" data-testid={`rollout-reason-${name}`}>{clip(group.reason)}</div>
      {group.since ? <div class="muted small">since {utcStamp(group.since)}</div> : null}
      {group.next_start ? <div class="small" data-testid={`rollout-next-${name}`}>next start: {inZone(group.next_start, group.time_zone, now)}</div> : null}
      <div class="small" data-testid={`rollout-versions-${name}`}>
        {versionCounts(group.versions).map(([v, n]) => <span class="chip mono" key={v}>{v} × {n}</span>)}
      </div>
      {canaries.shown.length > 0 ? (
        <ul class="rollout-list small" data-testid={`rollout-canaries-${name}`}>
          {canaries.shown.map((c) => (
            <li key={c.host_id} data-testid={`rollout-canary-${clip(c.nodename, 64)}`}>
              canary {clip(c.nodename, 64)} <Badge kind={canaryBadge(c.state)}>{clip(c.state, 32)}</Badge>{c.detail ? <span class="muted"> {clip(c.detail)}</span> : null}
            </li>
          ))}
          {canaries.more > 0 ? <li class="muted">and {canaries.more} more</li> : null}
        </ul>
      ) : null}
      {stale.shown.length > 0 ? (
        <ul class="rollout-list small" data-testid={`rollout-stale-${name}`}>
          {stale.shown.map((s) => (
            <li key={s.host_id}>
              <Badge kind="warn">stale</Badge> {clip(s.nodename, 64)}<span class="muted"> · upgrader last ran {s.last_run ? utcStamp(s.last_run) : 'never'}</span>
            </li>
          ))}
          {stale.more > 0 ? <li class="muted">and {stale.more} more</li> : null}
        </ul>
      ) : null}
    </div>
  );
}
