//! The terminal as an approval channel of a running `ring0 serve`: a held call is offered to
//! the MCP client (elicitation) and, at the same time, to `ring0 approve` / `ring0 deny` in
//! another terminal (the state directory's approvals directory, `ring0_policy`'s
//! `DirectoryApprover`). The first answer decides; the other offer is withdrawn.
//!
//! A call whose client cannot be asked goes back to the model with a confirmation code at once
//! (`Pending`), as before: it is not held, so there is nothing for the terminal to decide.

use async_trait::async_trait;
use ring0_kernel::CallExtensions;
use ring0_policy::{ApprovalOutcome, ApprovalRequest, Approver, DirectoryApprover};
use std::sync::Arc;

/// What `DirectoryApprover` answers when it could not offer the request: not a person's
/// decision, so the client's answer is waited for instead.
const NOT_OFFERED_PREFIX: &str = "the approval request could not be written";

/// Offers a held call to the client and to the terminal; the first answer decides.
pub struct ClientOrTerminal {
    client: Arc<dyn Approver>,
    terminal: DirectoryApprover,
    log: ring0_mcp::Log,
}

impl ClientOrTerminal {
    /// `client` asks over MCP; `terminal` is the approvals directory `ring0 approve` reads.
    pub fn new(
        client: Arc<dyn Approver>,
        terminal: DirectoryApprover,
        log: ring0_mcp::Log,
    ) -> Self {
        Self {
            client,
            terminal,
            log,
        }
    }
}

#[async_trait]
impl Approver for ClientOrTerminal {
    async fn decide(&self, request: &ApprovalRequest) -> ApprovalOutcome {
        self.decide_for(request, &CallExtensions::default()).await
    }

    async fn decide_for(
        &self,
        request: &ApprovalRequest,
        extensions: &CallExtensions,
    ) -> ApprovalOutcome {
        let client = self.client.decide_for(request, extensions);
        let terminal = self.terminal.decide(request);
        tokio::pin!(client, terminal);
        tokio::select! {
            // The client first: its `Pending` (no way to ask it) is immediate and final.
            biased;
            answer = &mut client => answer,
            answer = &mut terminal => match answer {
                ApprovalOutcome::Denied { reason } if reason.starts_with(NOT_OFFERED_PREFIX) => {
                    self.log.line(&format!(
                        "approval {} is not offered to `ring0 approve`: {reason}",
                        request.id
                    ));
                    client.await
                }
                answer => answer,
            },
        }
    }
}
