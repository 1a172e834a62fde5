"""LightningModules written the way Lightning's documentation writes them, used unchanged as
fedexp client objectives (`model=lightning model._target_=lightning_docs_model.LitModel`)."""

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn


class LitModel(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(28 * 28, 10)

    def forward(self, x):
        return torch.relu(self.l1(x.view(x.size(0), -1)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        y_hat = self(x)
        loss = F.cross_entropy(y_hat, y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.02)


class LitBodyHead(L.LightningModule):
    """The same classifier split into a representation `body` and a linear `head` (FedRep)."""

    def __init__(self, num_classes: int = 10, hidden: int = 32):
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.head(self.body(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.log("train_loss", loss)
        self.log("train_acc", (logits.argmax(dim=1) == y).float().mean())
        return {"loss": loss}

    def configure_optimizers(self):
        return {"optimizer": torch.optim.SGD(self.parameters(), lr=self.hparams.hidden / 320)}
