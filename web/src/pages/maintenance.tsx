/**
 * The cluster_maintenance_config window: shown to whoever may read it, edited (weekdays and start hour) by users
 * whose roles allow updating it. A refusal shows the server's message and code; to a user who lacks the role but
 * may grant it (an editor, as the README's first admin), also the commands that give it, the README's own lines.
 */
import { useEffect, useState } from 'preact/hooks';
import { api } from '../api.js';
import { useLoad } from '../components/load.js';
import { ErrorBox, Notice, PageHeader, Spinner } from '../components/ui.js';
import { MAINTENANCE_ROLE, maintenanceManifest, maintenanceRoleSteps, upgradesOf, type AgentUpgrades } from '../lib/manifest.js';
import { formatWindow, nextWindow, WEEKDAYS } from '../lib/time.js';
import type { CurrentSession } from '../types.js';

const HOURS = Array.from({ length: 24 }, (_, h) => h);
const hh = (h: number) => `${String(h).padStart(2, '0')}:00`;

function describe(u: AgentUpgrades | undefined): string {
  if (!u) return 'No maintenance window is set: agents install only critical releases.';
  if (u.weekdays.length === 0) return 'The window has no weekday: agents install only critical releases.';
  return `${u.weekdays.join(', ')} from ${hh(u.utc_start_hour)} to ${hh((u.utc_start_hour + 1) % 24)} UTC.`;
}

export function MaintenancePage({ session }: { session: CurrentSession }) {
  const canEdit = session.acl?.maintenance?.update === true;
  const { data, error, loading, reload } = useLoad(() => api.maintenance());
  const current = upgradesOf(data?.resources?.[0]);
  return (
    <>
      <PageHeader title="Maintenance window" subtitle="When agents may install a new version of their upgrade channel (one hour, weekly, in UTC)." />
      <ErrorBox error={error} testid="maint-error" />
      {error && (error as { status?: number }).status === 403 && session.acl?.maintenance?.grant ? <GrantSteps session={session} /> : null}
      {loading && !data ? <Spinner /> : null}
      {data ? (
        <div class="grid-2">
          <div class="card">
            <h2>Current window</h2>
            <p data-testid="maint-current">{describe(current)}</p>
            {current ? <p class="muted" data-testid="maint-next">Next: {nextLabel(current.weekdays, current.utc_start_hour)}</p> : null}
          </div>
          <div class="card">
            <h2>{canEdit ? 'Change the window' : 'Window settings'}</h2>
            <MaintenanceForm current={current} canEdit={canEdit} onSaved={reload} />
          </div>
        </div>
      ) : null}
    </>
  );
}

/** How a user who may create roles and set users' roles gets the window: the seed's role, then signing in again. */
function GrantSteps({ session }: { session: CurrentSession }) {
  return (
    <div class="card" data-testid="maint-grant">
      <h2>Get the maintenance window</h2>
      <p>
        No preset role allows <code>cluster_maintenance_config</code>: it takes a role of its own, <code>{MAINTENANCE_ROLE}</code>. Your roles may
        create it and give it to you. Run, signed in with <code>gwsh login</code> or on the Auth Service's machine:
      </p>
      <pre class="command" data-testid="maint-grant-steps">{maintenanceRoleSteps(session.user.name, session.user.roles)}</pre>
      <p class="muted small">Then sign out and in again: a role given works from the next sign-in.</p>
    </div>
  );
}

function nextLabel(weekdays: readonly string[], hour: number): string {
  const now = Date.now();
  const w = nextWindow(weekdays, hour, now);
  return w ? formatWindow({ start: new Date(w.start).toISOString(), end: new Date(w.end).toISOString() }, now) : 'none';
}

function MaintenanceForm({ current, canEdit, onSaved }: { current: AgentUpgrades | undefined; canEdit: boolean; onSaved: () => void }) {
  const [days, setDays] = useState<string[]>(current?.weekdays ?? []);
  const [hour, setHour] = useState<number>(current?.utc_start_hour ?? 2);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<Error | undefined>(undefined);
  const [saved, setSaved] = useState(false);
  useEffect(() => {
    setDays(current?.weekdays ?? []);
    setHour(current?.utc_start_hour ?? 2);
  }, [current?.weekdays.join(','), current?.utc_start_hour]);
  const toggle = (d: string) => {
    setSaved(false);
    setDays((ds) => (ds.includes(d) ? ds.filter((x) => x !== d) : [...ds, d]));
  };
  const save = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(undefined);
    setSaved(false);
    try {
      await api.saveManifest(maintenanceManifest(days, hour));
      setSaved(true);
      onSaved();
    } catch (err) {
      setError(err as Error);
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="form" onSubmit={save} data-testid="maint-form">
      {!canEdit ? <Notice testid="maint-readonly">Your roles let you see the window but not change it (the rule is update on cluster_maintenance_config).</Notice> : null}
      <fieldset class="field" disabled={!canEdit}>
        <legend>Weekdays</legend>
        <div class="weekdays" data-testid="maint-weekdays">
          {WEEKDAYS.map((d) => (
            <label key={d} class={days.includes(d) ? 'day on' : 'day'}>
              <input type="checkbox" checked={days.includes(d)} onChange={() => toggle(d)} data-testid={`maint-weekday-${d}`} />
              {d}
            </label>
          ))}
        </div>
      </fieldset>
      <label class="field">
        <span>Start hour (UTC)</span>
        <select value={String(hour)} disabled={!canEdit} onChange={(e) => { setSaved(false); setHour(Number(e.currentTarget.value)); }} data-testid="maint-hour">
          {HOURS.map((h) => <option key={h} value={String(h)}>{hh(h)}–{hh((h + 1) % 24)} UTC</option>)}
        </select>
      </label>
      <p class="muted small" data-testid="maint-preview">Next window with these settings: {nextLabel(days, hour)}</p>
      <ErrorBox error={error} testid="maint-error" />
      {saved ? <Notice kind="success" testid="maint-saved">Saved. Agents pick up the new window at their next check.</Notice> : null}
      {canEdit ? (
        <button type="submit" class="btn btn-primary" disabled={busy} data-testid="maint-save">{busy ? 'Saving…' : 'Save window'}</button>
      ) : null}
    </form>
  );
}
