-- 0016 down: CONNECT back to PUBLIC (the default), and the app role's own CONNECT grant
-- revoked. The role is not dropped (roles are cluster-wide: another database may use it).
-- The privileges 0016 revoked from cyberos_app for another KB_APP_ROLE are not put back:
-- below head the layer is not re-applied, and its grants stay with the configured role.
do $$
begin
  execute format('grant connect on database %I to public', current_database());
  execute format('revoke connect on database %I from {{app_role}}', current_database());
end
$$;
